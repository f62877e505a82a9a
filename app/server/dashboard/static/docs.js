// /docs: this server's own OpenAPI document in Swagger UI (vendored, served from this server). The
// document and every "Try it out" request carry the dashboard's key from this tab's session storage.
(() => {
  "use strict";

  const key = sessionStorage.getItem("switchyard.key");
  const auth = key ? { Authorization: "Bearer " + key } : {};

  async function main() {
    const resp = await fetch("/openapi.json", { headers: auth, mode: "same-origin", credentials: "omit" });
    if (!resp.ok) {
      const box = document.getElementById("error");
      box.textContent =
        resp.status === 401
          ? "This server needs an API key: enter it on the dashboard (/ui) in this tab first."
          : "The API document could not be read: HTTP " + resp.status;
      box.hidden = false;
      return;
    }
    const spec = await resp.json();
    spec.servers = [{ url: window.location.origin }]; // "Try it out" calls this server, as it is reached
    window.SwaggerUIBundle({
      spec,
      dom_id: "#swagger",
      deepLinking: false,
      validatorUrl: null,
      requestInterceptor: (req) => {
        if (key) req.headers.Authorization = "Bearer " + key;
        return req;
      },
    });
  }

  main();
})();
