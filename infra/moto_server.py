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

import copy
import os
import signal
import sys
import threading

import moto.backends
import moto.dynamodb.models as dynamodb_models
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


def speed_up_moto() -> None:
    """Two costs of moto 5.2.5 that change nothing it answers (py-spy over a
    full test run):

    - every request lists moto's package directory to find its backend
      (`list_of_moto_modules`, 7% of the server's time): the list never
      changes while it runs, so it is read once;
    - TransactWriteItems deep-copies a table once per operation naming it,
      to restore it if the transaction is cancelled (12%): the copies are
      identical (nothing changes in between), so one per table is made.
      Requests run one at a time (below), so swapping the module's `copy`
      for the length of one transaction is safe.
    """
    modules = tuple(moto.backends.list_of_moto_modules())
    moto.backends.list_of_moto_modules = lambda: modules

    class OncePerTable:
        def __init__(self):
            self.tables = {}

        def deepcopy(self, obj, *args, **kwargs):
            if isinstance(obj, dynamodb_models.Table):
                if id(obj) not in self.tables:
                    self.tables[id(obj)] = copy.deepcopy(obj)
                return self.tables[id(obj)]
            return copy.deepcopy(obj, *args, **kwargs)

    transact = dynamodb_models.DynamoDBBackend.transact_write_items

    def transact_write_items(self, transact_items):
        dynamodb_models.copy = OncePerTable()
        try:
            return transact(self, transact_items)
        finally:
            dynamodb_models.copy = copy

    dynamodb_models.DynamoDBBackend.transact_write_items = transact_write_items


class QuietRequestHandler(MotoRequestHandler):
    """No access-log line per request: writing it took about a tenth of
    the server's time in a full test run (errors are still logged)."""

    def log_request(self, code="-", size="-"):
        pass


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    speed_up_moto()
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
