// Starts Swagger UI on /docs with the settings the server wrote into
// <script type="application/json" id="docs-config">: the page's CSP runs no inline script.
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("docs-config").textContent);
  window.ui = SwaggerUIBundle({
    url: config.openapi_url,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    oauth2RedirectUrl: window.location.origin + config.oauth2_redirect_url,
    presets: [SwaggerUIBundle.presets.apis],
  });
})();
