"""A typed client generated from docs/openapi.json by openapi-python-client,
used as a merchant's server would: create a checkout, read it back, list
sessions, and see a refusal typed as the error envelope. Run by
tests/e2e/openapi.rs with the generated package on PYTHONPATH:

    python generated_client_smoke.py <base url> <sandbox key>
"""

import sys

from dhukuti_client import AuthenticatedClient
from dhukuti_client.api.checkout import create_checkout, get_session, list_sessions
from dhukuti_client.models import CheckoutCreated, CheckoutSession, CreateCheckout, Error


def main(base: str, key: str) -> None:
    client = AuthenticatedClient(base_url=base, token=key, raise_on_unexpected_status=True)

    created = create_checkout.sync_detailed(
        client=client,
        body=CreateCheckout(amount=15000, return_url="https://shop.example/done"),
        idempotency_key="smoke-1",
    )
    assert created.status_code == 201, created
    session = created.parsed
    assert isinstance(session, CheckoutCreated), session
    assert session.id.startswith("cs_") and session.livemode is False, session
    assert session.checkout_url.endswith("/c/" + session.id), session

    got = get_session.sync(client=client, id=session.id)
    assert isinstance(got, CheckoutSession), got
    assert got.id == session.id and got.amount == 15000, got
    assert got.status.value == "pending", got

    page = list_sessions.sync(client=client, limit=10)
    assert any(s.id == session.id for s in page.data), page
    assert page.meta.total >= 1, page

    missing = get_session.sync_detailed(client=client, id="cs_missing")
    assert missing.status_code == 404, missing
    assert isinstance(missing.parsed, Error), missing.parsed
    assert missing.parsed.error.code == "not_found", missing.parsed

    print("generated client behaved")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
