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

  // An EventSource retries a dropped stream by itself, but gives up for
  // good on an answer other than 200 (429 or 503 when streams are busy):
  // then the screen listens again a few seconds later.
  function listen(url) {
    var over = false;
    var end = function (text, cls) {
      over = true; say(text, cls); box.hidden = true; source.close();
    };
    source = new EventSource(url);
    source.addEventListener("qr.scanned", function () {
      say("Scanned: waiting for the payment…");
    });
    source.addEventListener("qr.paid", function () { end("Paid", "paid"); });
    source.addEventListener("qr.failed", function () { end("Payment failed", "failed"); });
    source.addEventListener("qr.expired", function () { end("QR expired", "failed"); });
    source.onerror = function () {
      if (!over && source.readyState === EventSource.CLOSED) {
        setTimeout(function () { listen(url); }, 3000);
      }
    };
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
      listen(a.body.events);
    }).catch(function () { say("Could not reach the gateway", "failed"); });
  });
})();
