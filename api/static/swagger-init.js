// Starts Swagger UI on /docs (a file, not an inline script: the page's CSP allows none).
// validatorUrl null: Swagger UI would otherwise ask a public validator about the spec.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  validatorUrl: null,
  deepLinking: true,
  layout: "BaseLayout",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
