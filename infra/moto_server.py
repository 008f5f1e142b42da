"""moto's server for the tests, with DynamoDB requests served one at a time.

moto 5.2.5 serves requests on parallel threads without a lock around its
DynamoDB tables: a cancelled transaction restores a copy of the whole table
taken when it started (undoing other threads' commits in between), and ADD
updates race. Real DynamoDB is atomic, and our concurrency tests rely on it,
so DynamoDB calls are serialized here. SQS and S3 stay concurrent, so a long
poll on a queue never blocks the table.

Usage: python infra/moto_server.py HOST PORT
"""

import os
import signal
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    dynamodb = threading.Lock()

    def serialized(environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
            with dynamodb:
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
    run_simple(host, port, serialized, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
