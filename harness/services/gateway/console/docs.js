// The API reference page (/docs): Swagger UI on the gateway's own OpenAPI document.
// A file, not an inline script: the page's CSP runs the gateway's own scripts only.
"use strict";
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // (its badge would ask validator.swagger.io)
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
