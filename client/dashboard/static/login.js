// The login page: the token is checked against the scheduler, then kept in an HttpOnly cookie.
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  const error = document.getElementById("error");
  if (params.get("why")) error.textContent = params.get("why");
  document.getElementById("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const button = document.getElementById("submit");
    button.disabled = true;
    try {
      await Gs.api("/api/login", { body: { token: document.getElementById("token").value }, noLoginRedirect: true });
      const next = params.get("next") || "/";
      location.href = next.startsWith("/") && !next.startsWith("//") ? next : "/";
    } catch (err) {
      error.textContent = err.message;
    } finally {
      button.disabled = false;
    }
  });
})();
