// The API's documentation at /docs: Swagger UI (loaded by the page, pinned and with
// Subresource Integrity, see baton.api.guard) over the OpenAPI document. A file of its own,
// not an inline script, so the page's Content-Security-Policy can refuse every inline one.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  layout: "BaseLayout",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
