import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, str(HERE / "count.py"), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_words_flag(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("one two\nthree  four five\n")
    assert run("--words", str(path)) == "5\n"
    assert run(str(path)) == "2\n"
