// Starts Swagger UI on the page /docs serves (ours, not vendored; loaded
// after swagger-ui-bundle.js). It fetches only /openapi.json, from the
// page's own origin: Swagger's online validator stays off (it would send
// the document to a remote host), and so, by Swagger UI's default, does
// reading another document's address from the page's query string.
"use strict";

window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#ui",
  deepLinking: true,
  tryItOutEnabled: false,
  validatorUrl: null,
});
