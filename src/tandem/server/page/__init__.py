"""The web page at `/`: its routes (routes.py) and its files (static/), shipped in the package."""
