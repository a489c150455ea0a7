// Tandem's page as an installable app: its own files come from the server when it answers,
// from the last copy otherwise. API calls are never touched.
"use strict";
const CACHE = "tandem-page";
const FILES = ["./", "static/app.js", "static/models.js", "static/app.css", "static/icon.svg", "manifest.webmanifest"];
const PAGE = new Set(FILES.map((f) => new URL(f, self.registration.scope).pathname));

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(CACHE).then((c) => c.addAll(FILES)).catch(() => undefined));
  self.skipWaiting();
});

self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || url.origin !== self.location.origin || !PAGE.has(url.pathname)) {
    return;
  }
  event.respondWith(
    fetch(event.request)
      .then((res) => {
        if (res.ok) {
          const copy = res.clone();
          caches.open(CACHE).then((c) => c.put(event.request, copy));
        }
        return res;
      })
      .catch(() => caches.match(event.request).then((hit) => hit || Response.error())),
  );
});
