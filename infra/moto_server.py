"""moto's server for the tests, with requests served one at a time.

moto 5.2.5 serves requests on parallel threads without locks around its
state: a cancelled DynamoDB transaction restores a copy of the whole table
taken when it started (undoing other threads' commits in between), ADD
updates race, and concurrent S3 puts to one key can fail with a 500. Real
AWS is consistent, and our concurrency tests rely on it, so every request is
serialized here except SQS ReceiveMessage, so that a long poll on a queue
never blocks the table or the bucket.

Usage: python infra/moto_server.py HOST PORT
"""

import os
import signal
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


class QuietRequestHandler(MotoRequestHandler):
    """No access-log line per request: writing it took about a tenth of
    the server's time in a full test run (errors are still logged)."""

    def log_request(self, code="-", size="-"):
        pass


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        long_poll = target == "AmazonSQS.ReceiveMessage" or (
            "Action=ReceiveMessage" in environ.get("QUERY_STRING", "")
        )
        if not long_poll:
            with lock:
                result = app(environ, start_response)
                try:
                    body = b"".join(result)
                finally:
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()
                return [body]
        return app(environ, start_response)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple(host, port, serialized, threaded=True, request_handler=QuietRequestHandler)


if __name__ == "__main__":
    main()
