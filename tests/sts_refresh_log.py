"""Run by tests/test_s3_session_safety.py in a process of its own: an assumed-role
boto3 session refreshes through a local fake STS, whose answer botocore.parsers logs at
DEBUG (the new access key, secret key and session token). Prints which of them the
log shows in clear."""

from __future__ import annotations

import http.server
import io
import logging
import os
import tempfile
import threading

AK = "ASIANEWKEY0000000001"
SK = "NewSecretKeyFromSTS/abcdefghijklmnop"
TOK = "NewSessionTokenFromSTS+xyz/123=="
SOURCE_AK, SOURCE_SK = "AKIASOURCE0000000001", "sourcesecretkey1234567890"
BODY = (
    '<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
    f"<AssumeRoleResult>\n<Credentials><AccessKeyId>{AK}</AccessKeyId>"
    f"<SecretAccessKey>{SK}</SecretAccessKey><SessionToken>{TOK}</SessionToken>\n"
    "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials><AssumedRoleUser>"
    "<Arn>arn:aws:sts::123456789012:assumed-role/r/s</Arn>\n<AssumedRoleId>AROA:s"
    "</AssumedRoleId></AssumedRoleUser></AssumeRoleResult><ResponseMetadata><RequestId>1"
    "</RequestId></ResponseMetadata></AssumeRoleResponse>"
).encode()


class FakeSTS(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), FakeSTS)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    home = tempfile.mkdtemp()
    with open(f"{home}/config", "w") as f:
        f.write("[profile src]\nregion = us-east-1\n[profile role]\n"
                "role_arn = arn:aws:iam::123456789012:role/r\nsource_profile = src\n"
                "region = us-east-1\n")
    with open(f"{home}/credentials", "w") as f:
        f.write(f"[src]\naws_access_key_id = {SOURCE_AK}\n"
                f"aws_secret_access_key = {SOURCE_SK}\n")
    os.environ.update(AWS_CONFIG_FILE=f"{home}/config",
                      AWS_SHARED_CREDENTIALS_FILE=f"{home}/credentials",
                      AWS_ENDPOINT_URL_STS=f"http://127.0.0.1:{server.server_port}")
    import boto3

    from pawn_queue_sync.storage.s3.secrets import SECRET_FILTER

    SECRET_FILTER.add(SOURCE_AK, SOURCE_SK)  # what building a store does
    out = io.StringIO()
    logging.getLogger().addHandler(logging.StreamHandler(out))
    logging.getLogger().setLevel(logging.DEBUG)
    boto3.Session(profile_name="role").get_credentials().get_frozen_credentials()
    log = out.getvalue()
    assert "SecretAccessKey" in log, "botocore logged no STS answer: nothing was tested"
    secrets = {"access key": AK, "secret key": SK, "token": TOK, "source secret": SOURCE_SK}
    print("leaked:", [name for name, value in secrets.items() if value in log])


if __name__ == "__main__":
    main()
