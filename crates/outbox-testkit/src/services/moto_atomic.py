"""moto's server, with DynamoDB's TransactWriteItems made all-or-nothing.

moto 5 applies a transaction's writes one by one and, when a condition fails, puts back a copy
of each table it touched. The writes before the failure have by then reached the table's
stream shard, and the copy replaces the shard object that open shard iterators read: a stream
reader then sees records that never committed and misses later ones. DynamoDB checks every
condition before it writes anything. This launcher checks the conditions first, the same
way moto does, and refuses the whole transaction before any write when one fails; then it
lets moto run it.

moto's server is threaded and its transactions take no lock: two at once on one item could
both pass their conditions, or one's restore could undo the other's writes. DynamoDB isolates
transactions from each other (serializable), so this launcher runs one at a time. Plain
writes (PutItem, UpdateItem) still interleave with a transaction as moto has it.
Everything else is moto as installed. Arguments are moto_server's.
"""

import sys
import threading

from moto.dynamodb.comparisons import get_filter_expression
from moto.dynamodb.exceptions import TransactionCanceledException
from moto.dynamodb.models import DynamoDBBackend

_apply = DynamoDBBackend.transact_write_items
_one_at_a_time = threading.Lock()


def _key(table, op_type, op):
    if op_type != "Put":
        return op["Key"]
    item = op["Item"]
    key = {table.hash_key_attr: item[table.hash_key_attr]}
    if table.range_key_attr is not None:
        key[table.range_key_attr] = item[table.range_key_attr]
    return key


def transact_write_items(self, transact_items):
    with _one_at_a_time:
        return _checked(self, transact_items)


def _checked(self, transact_items):
    reasons = []
    failed = False
    for entry in transact_items:
        op_type, op = next(iter(entry.items()))
        condition = op.get("ConditionExpression")
        if condition is None or op.get("TableName") not in self.tables:
            reasons.append((None, None, None))
            continue
        table = self.get_table(op["TableName"])
        current = self.get_item(op["TableName"], _key(table, op_type, op))
        check = get_filter_expression(
            condition,
            op.get("ExpressionAttributeNames"),
            op.get("ExpressionAttributeValues"),
        )
        if check.expr(current):
            reasons.append((None, None, None))
        else:
            failed = True
            reasons.append(
                ("ConditionalCheckFailed", "The conditional request failed", None)
            )
    if failed:
        raise TransactionCanceledException(reasons)
    return _apply(self, transact_items)


DynamoDBBackend.transact_write_items = transact_write_items

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
