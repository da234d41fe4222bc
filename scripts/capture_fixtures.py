#!/usr/bin/env python3
"""Capture real DynamoDB Streams records from DynamoDB Local into tests/fixtures/.

Usage:
    scripts/ddb-local start
    python3 scripts/capture_fixtures.py            # needs boto3 (pip install boto3)

The endpoint is taken from --endpoint-url, else $AWS_ENDPOINT_URL, else from
`scripts/ddb-local env` (the one instance that script started).

What it does, against a fresh `UserServiceTable` (dropped first if present):

 1. writes a small history for user u1:
      put    USER#u1 / PROFILE    (userId, firstName, lastName, status, version, createdAt, updatedAt)
      put    USER#u1 / EMAIL#e1   (emailId, userId, email, isPrimary=true,  isVerified, createdAt)
      put    USER#u1 / EMAIL#e2   (emailId, userId, email, isPrimary=false, isVerified, createdAt)
      update USER#u1 / EMAIL#e1   SET isPrimary = false   } the primary switch,
      update USER#u1 / EMAIL#e2   SET isPrimary = true    } as two plain updates
      delete USER#u1 / EMAIL#e1
 2. reads the stream (DescribeStream, GetShardIterator TRIM_HORIZON, GetRecords)
    and saves the GetRecords HTTP response body as it came over the wire
    (pretty-printed; keys, order and number literals untouched):
      tests/fixtures/streams-get-records.json
 3. reshapes those records as AWS Lambda delivers them to a function:
      tests/fixtures/lambda-event.json
 4. writes the REMOVE of EMAIL#e1 once more as Lambda delivers a deletion made
    by TTL (the same record plus userIdentity Service / dynamodb.amazonaws.com):
      tests/fixtures/lambda-event-ttl.json
    DynamoDB Local cannot produce that record itself: in 3.3.0 its TTL job never
    deletes items of a table that has a GSI, and on tables without one it
    emits eventName "UNKNOWN_TO_SDK_VERSION" with no userIdentity.
"""

from __future__ import annotations

import argparse
import decimal
import json
import os
import subprocess
import sys
import time
from pathlib import Path

try:
    import boto3
    from botocore.config import Config
except ImportError:  # pragma: no cover
    sys.exit("capture_fixtures: boto3 is missing; install it with: pip install boto3")

REPO = Path(__file__).resolve().parent.parent
TABLE = "UserServiceTable"

# What a Lambda function in us-east-1 would see (DynamoDB Local says "ddblocal"
# and account 000000000000).
LAMBDA_REGION = "us-east-1"
LAMBDA_ACCOUNT = "123456789012"


def log(msg: str) -> None:
    print(f"capture_fixtures: {msg}", file=sys.stderr)


def die(msg: str) -> None:
    sys.exit(f"capture_fixtures: error: {msg}")


# --------------------------------------------------------------------- JSON ---
#
# The raw fixtures keep the wire's number literals (DynamoDB Local writes
# ApproximateCreationDateTime as e.g. 1795325940.000, which float() would turn
# into 1795325940.0), so numbers are parsed into Num, a str that is written back
# verbatim.


class Num(str):
    """A JSON number literal, kept as written."""


def parse(raw: bytes):
    return json.loads(raw, parse_float=Num, parse_int=Num)


def dumps(value, indent: int = 0) -> str:
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, Num):
        return str(value)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        items = [f"{inner}{dumps(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(value) + "\n", encoding="utf-8")
    log(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


# ------------------------------------------------------------------ clients ---


def endpoint_from_ddb_local() -> str | None:
    script = REPO / "scripts" / "ddb-local"
    try:
        out = subprocess.run([str(script), "env"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        stderr = getattr(e, "stderr", "") or ""
        log(f"`scripts/ddb-local env` failed: {stderr.strip() or e}")
        return None
    for line in out.splitlines():
        if line.startswith("export AWS_ENDPOINT_URL="):
            return line.split("=", 1)[1].strip()
    return None


def clients(endpoint: str):
    session = boto3.session.Session(
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "local"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "local"),
        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    )
    cfg = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30)
    ddb = session.client("dynamodb", endpoint_url=endpoint, config=cfg)
    streams = session.client("dynamodbstreams", endpoint_url=endpoint, config=cfg)
    return ddb, streams


class RawBodies:
    """Keeps the HTTP body of each GetRecords response, before botocore parses it
    (the parsed form has ApproximateCreationDateTime turned into datetime)."""

    def __init__(self, streams_client):
        self.last: bytes | None = None
        streams_client.meta.events.register("after-call.dynamodbstreams.GetRecords", self._hook)

    def _hook(self, http_response, **_kwargs):
        self.last = http_response.content


# ------------------------------------------------------------------ history ---

S = lambda v: {"S": v}  # noqa: E731
N = lambda v: {"N": str(v)}  # noqa: E731
B = lambda v: {"BOOL": v}  # noqa: E731
KEY = lambda sk: {"PK": S("USER#u1"), "SK": S(sk)}  # noqa: E731

PROFILE = {
    **KEY("PROFILE"),
    "userId": S("u1"),
    "firstName": S("Alice"),
    "lastName": S("Smith"),
    "status": S("ACTIVE"),
    "version": N(1),
    "createdAt": S("2026-01-15T09:30:00.000Z"),
    "updatedAt": S("2026-01-15T09:30:00.000Z"),
}
EMAIL_E1 = {
    **KEY("EMAIL#e1"),
    "emailId": S("e1"),
    "userId": S("u1"),
    "email": S("alice@example.com"),
    "isPrimary": B(True),
    "isVerified": B(True),
    "createdAt": S("2026-01-15T09:30:00.000Z"),
}
EMAIL_E2 = {
    **KEY("EMAIL#e2"),
    "emailId": S("e2"),
    "userId": S("u1"),
    "email": S("Alice.Smith@Work.Example.com"),
    "isPrimary": B(False),
    "isVerified": B(True),
    "createdAt": S("2026-02-03T14:12:45.000Z"),
}
EXPECTED_EVENTS = [
    ("INSERT", "PROFILE"),
    ("INSERT", "EMAIL#e1"),
    ("INSERT", "EMAIL#e2"),
    ("MODIFY", "EMAIL#e1"),
    ("MODIFY", "EMAIL#e2"),
    ("REMOVE", "EMAIL#e1"),
]


def create_table(ddb) -> str:
    existing = ddb.list_tables().get("TableNames", [])
    if TABLE in existing:
        log(f"dropping the existing {TABLE}")
        ddb.delete_table(TableName=TABLE)
        ddb.get_waiter("table_not_exists").wait(TableName=TABLE, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    ddb.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "PK", "AttributeType": "S"},
            {"AttributeName": "SK", "AttributeType": "S"},
            {"AttributeName": "GSI1PK", "AttributeType": "S"},
            {"AttributeName": "GSI1SK", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "GSI1",
                "KeySchema": [
                    {"AttributeName": "GSI1PK", "KeyType": "HASH"},
                    {"AttributeName": "GSI1SK", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    ddb.get_waiter("table_exists").wait(TableName=TABLE, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    arn = ddb.describe_table(TableName=TABLE)["Table"].get("LatestStreamArn")
    if not arn:
        die(f"{TABLE} has no stream ARN after CreateTable")
    return arn


def write_history(ddb) -> None:
    ddb.put_item(TableName=TABLE, Item=PROFILE)
    ddb.put_item(TableName=TABLE, Item=EMAIL_E1)
    ddb.put_item(TableName=TABLE, Item=EMAIL_E2)
    # The primary switch, as two plain (non-transactional) updates.
    for sk, primary in (("EMAIL#e1", False), ("EMAIL#e2", True)):
        ddb.update_item(
            TableName=TABLE,
            Key=KEY(sk),
            UpdateExpression="SET isPrimary = :p",
            ExpressionAttributeValues={":p": B(primary)},
        )
    ddb.delete_item(TableName=TABLE, Key=KEY("EMAIL#e1"))


# ------------------------------------------------------------------ streams ---


def only_shard(streams, stream_arn: str) -> str:
    desc = streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]
    shards = desc.get("Shards", [])
    if len(shards) != 1:
        die(f"expected one shard in {stream_arn}, found {len(shards)}")
    return shards[0]["ShardId"]


def read_page(streams, raw: RawBodies, iterator: str, want: int, timeout: float = 30.0):
    """GetRecords until one response holds `want` records; returns that response
    as it came over the wire (parsed with number literals kept).

    With a TRIM_HORIZON iterator every retry starts over from the shard's start,
    so the saved response is one complete, real GetRecords answer."""
    deadline = time.monotonic() + timeout
    while True:
        raw.last = None
        streams.get_records(ShardIterator=iterator)
        if raw.last is None:
            die("the GetRecords hook saw no HTTP body")
        page = parse(raw.last)
        got = len(page.get("Records", []))
        if got >= want:
            return page
        if time.monotonic() > deadline:
            die(f"GetRecords returned {got} records, expected {want}, after {timeout:.0f}s")
        time.sleep(0.5)


def sk_of(record) -> str:
    return record["dynamodb"]["Keys"]["SK"]["S"]


def check_main(records) -> None:
    got = [(r["eventName"], sk_of(r)) for r in records]
    if got != EXPECTED_EVENTS:
        die(f"unexpected stream history:\n  got      {got}\n  expected {EXPECTED_EVENTS}")


# ------------------------------------------------------------------- lambda ---


def lambda_arn(stream_arn: str) -> str:
    # arn:aws:dynamodb:<region>:<account>:table/<name>/stream/<label>
    parts = stream_arn.split(":", 5)
    if len(parts) != 6 or parts[2] != "dynamodb":
        die(f"unexpected stream ARN: {stream_arn}")
    parts[3], parts[4] = LAMBDA_REGION, LAMBDA_ACCOUNT
    return ":".join(parts)


def lambda_record(record, stream_arn: str, *, ttl: bool = False):
    """One Streams API record as Lambda's event source mapping delivers it."""
    src = record["dynamodb"]
    dyn = {}
    if "ApproximateCreationDateTime" in src:
        # Lambda gives whole epoch seconds as a JSON number.
        dyn["ApproximateCreationDateTime"] = int(decimal.Decimal(str(src["ApproximateCreationDateTime"])))
    dyn["Keys"] = src["Keys"]
    for image in ("NewImage", "OldImage"):
        if src.get(image):  # Lambda leaves absent images out
            dyn[image] = src[image]
    for field in ("SequenceNumber", "SizeBytes", "StreamViewType"):
        if field in src:
            dyn[field] = src[field]
    out = {
        "eventID": record["eventID"],
        "eventName": record["eventName"],
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": LAMBDA_REGION,
        "dynamodb": dyn,
    }
    if ttl:
        out["userIdentity"] = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    elif "userIdentity" in record:
        out["userIdentity"] = record["userIdentity"]
    out["eventSourceARN"] = lambda_arn(stream_arn)
    return out


# --------------------------------------------------------------------- main ---


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint-url", help="DynamoDB Local endpoint (default: $AWS_ENDPOINT_URL or `scripts/ddb-local env`)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "tests" / "fixtures")
    args = ap.parse_args()

    endpoint = args.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or endpoint_from_ddb_local()
    if not endpoint:
        die("no endpoint: run `scripts/ddb-local start` first (or pass --endpoint-url / set AWS_ENDPOINT_URL)")
    log(f"using {endpoint}")
    out = args.out_dir.resolve()

    ddb, streams = clients(endpoint)
    raw = RawBodies(streams)

    stream_arn = create_table(ddb)
    write_history(ddb)

    shard = only_shard(streams, stream_arn)
    it = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    page = read_page(streams, raw, it, len(EXPECTED_EVENTS))
    records = page["Records"]
    check_main(records)
    first_seq = records[0]["dynamodb"].get("SequenceNumber", "")
    if first_seq.lstrip("0") != "1":
        log(f"note: sequence numbers start at {first_seq}: DynamoDB Local numbers records across all "
            "tables of the instance; use a freshly started instance for the canonical fixtures")
    write_json(out / "streams-get-records.json", page)
    write_json(
        out / "lambda-event.json",
        {"Records": [lambda_record(r, stream_arn) for r in records]},
    )

    # A TTL deletion, as Lambda delivers one: the REMOVE above plus userIdentity.
    write_json(
        out / "lambda-event-ttl.json",
        {"Records": [lambda_record(records[-1], stream_arn, ttl=True)]},
    )


if __name__ == "__main__":
    main()
