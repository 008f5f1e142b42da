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
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


def speed_up_moto() -> None:
    """Two costs of moto 5.2.5 that change nothing it answers (py-spy over a
    full test run):

    - every request lists moto's package directory to find its backend
      (`list_of_moto_modules`, 7% of the server's time): the list never
      changes while it runs, so it is read once;
    - TransactWriteItems deep-copies a whole table once per operation
      naming it, to restore it if the transaction is cancelled (12%). On a
      table of a thousand items a thousand transactions took 34 s and left
      the server at 2 GB (the full suite once drove one to 11.8 GB). Only
      the items a transaction names can change, so only those are copied
      before it and put back when it is cancelled. Requests run one at a
      time (below), so swapping the module's `copy` for the length of one
      transaction is safe.
    """
    modules = tuple(moto.backends.list_of_moto_modules())
    moto.backends.list_of_moto_modules = lambda: modules

    class NoTableCopy:
        """moto's `copy` during one transaction: a table is "copied" as
        itself (its rollback then assigns the same table back)."""

        def deepcopy(self, obj, *args, **kwargs):
            if isinstance(obj, dynamodb_models.Table):
                return obj
            return copy.deepcopy(obj, *args, **kwargs)

    def touched(backend, transact_items):
        """(table, hash, range) of every item a transaction names."""
        keys = []
        for entry in transact_items:
            for op in entry.values():
                table = backend.tables.get(op.get("TableName"))
                if table is None:
                    continue
                key = op.get("Key") or op.get("Item") or {}
                if table.hash_key_attr not in key:
                    continue
                hash_value = DynamoType(key[table.hash_key_attr])
                range_value = None
                if table.range_key_attr is not None:
                    if table.range_key_attr not in key:
                        continue
                    range_value = DynamoType(key[table.range_key_attr])
                keys.append((table, hash_value, range_value))
        return keys

    def restore(table, hash_value, range_value, before):
        if range_value is None:
            if before is None:
                table.items.pop(hash_value, None)
            else:
                table.items[hash_value] = before
            return
        if before is None:
            table.items.get(hash_value, {}).pop(range_value, None)
        else:
            table.items[hash_value][range_value] = before

    transact = dynamodb_models.DynamoDBBackend.transact_write_items

    def transact_write_items(self, transact_items):
        keys = touched(self, transact_items)
        saved = []
        for table, hash_value, range_value in keys:
            try:
                before = table.get_item(hash_value, range_value)
            except Exception:  # moto's own validation answers below
                before = None
            saved.append((table, hash_value, range_value, copy.deepcopy(before)))
        dynamodb_models.copy = NoTableCopy()
        try:
            return transact(self, transact_items)
        except Exception:
            for table, hash_value, range_value, before in reversed(saved):
                restore(table, hash_value, range_value, before)
            raise
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
