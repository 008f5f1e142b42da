// The counter's screen: ask for a QR, show it, listen for the outcome.
(function () {
  "use strict";
  var form = document.getElementById("ask");
  var box = document.getElementById("qr");
  var code = document.getElementById("code");
  var state = document.getElementById("state");
  var source = null;

  function say(text, cls) {
    state.textContent = text;
    state.className = cls || "";
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    if (source) { source.close(); source = null; }
    var amount = parseInt(document.getElementById("amount").value, 10);
    say("Asking Fonepay for a QR…");
    fetch("/demo/counter/qr", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ amount: amount })
    }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (a) {
      if (!a.ok) { say(a.body.error || "Could not make a QR", "failed"); return; }
      code.src = a.body.qr_image;
      box.hidden = false;
      box.dataset.session = a.body.id;
      say("Scan to pay");
      source = new EventSource(a.body.events);
      source.addEventListener("qr.scanned", function () {
        say("Scanned: waiting for the payment…");
      });
      source.addEventListener("qr.paid", function () {
        say("Paid", "paid"); box.hidden = true; source.close();
      });
      source.addEventListener("qr.failed", function () {
        say("Payment failed", "failed"); box.hidden = true; source.close();
      });
      source.addEventListener("qr.expired", function () {
        say("QR expired", "failed"); box.hidden = true; source.close();
      });
    }).catch(function () { say("Could not reach the gateway", "failed"); });
  });
})();
