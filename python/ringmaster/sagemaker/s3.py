"""S3 for ringmaster.sagemaker, through boto3 with the standard AWS credential chain: input channels
downloaded on the ranks' hosts, the job's model and output uploaded in SageMaker's layout.
AWS_ENDPOINT_URL (an S3-compatible server) is honoured also by boto3 releases older than 1.28,
which do not read it themselves."""
import os


class S3Error(ValueError):
    """An S3 URI that cannot be used: the message names the URI and why."""


def is_s3(uri):
    return isinstance(uri, str) and uri.startswith("s3://")


def split(uri):
    """("bucket", "key/prefix") of "s3://bucket/key/prefix"; S3Error for a malformed URI."""
    if not is_s3(uri):
        raise S3Error(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise S3Error(f"{uri}: no bucket named")
    return bucket, key


def client():
    try:
        import boto3
    except ImportError:
        raise S3Error("s3:// URIs need boto3, which this Python does not have (Debian: apt install "
                      "python3-boto3; a virtual environment: pip install boto3)") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint or None)


def _explain(uri, error):
    """An S3Error naming `uri` for a botocore error."""
    name = type(error).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return S3Error(f"{uri}: no AWS credentials found (the standard chain: AWS_ACCESS_KEY_ID and "
                       f"AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, AWS_PROFILE, an instance role)")
    if name == "EndpointConnectionError":
        return S3Error(f"{uri}: cannot reach S3 at {getattr(error, 'kwargs', {}).get('endpoint_url')}"
                       f" ({error})")
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", name))
    if code in ("NoSuchBucket", "404"):
        return S3Error(f"{uri}: the bucket '{split(uri)[0]}' does not exist")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return S3Error(f"{uri}: access denied ({code}): the credentials may not read or write it")
    return S3Error(f"{uri}: {code}: {error}")


def _errors():
    import botocore.exceptions
    return (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


def check_readable(uri):
    """Raises S3Error unless `uri` names at least one object this caller may read."""
    bucket, prefix = split(uri)
    s3 = client()
    try:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except _errors() as e:
        raise _explain(uri, e) from None
    if not listed.get("Contents"):
        raise S3Error(f"{uri}: no objects under this prefix")


def check_writable(uri):
    """Raises S3Error unless the bucket of `uri` exists and this caller may write under `uri`."""
    bucket, prefix = split(uri)
    s3 = client()
    key = f"{prefix.rstrip('/')}/.ringmaster-write-check".lstrip("/")
    try:
        s3.head_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key=key, Body=b"")
        s3.delete_object(Bucket=bucket, Key=key)
    except _errors() as e:
        raise _explain(uri, e) from None


def download_prefix(uri, directory):
    """Every object under `uri` into `directory` (keys relative to the prefix, as SageMaker's
    File mode lays a channel out); returns how many."""
    bucket, prefix = split(uri)
    s3 = client()
    count = 0
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                relative = key[len(prefix):].lstrip("/") if prefix else key
                if not relative or key.endswith("/"):
                    relative = relative or os.path.basename(key)
                    if key.endswith("/"):
                        continue  # a "directory" placeholder
                target = os.path.join(directory, relative)
                if not os.path.abspath(target).startswith(os.path.abspath(directory) + os.sep):
                    raise S3Error(f"{uri}: key {key!r} would land outside {directory}")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                s3.download_file(bucket, key, target)
                count += 1
    except _errors() as e:
        raise _explain(uri, e) from None
    return count


def upload_file(path, uri):
    bucket, key = split(uri)
    try:
        client().upload_file(path, bucket, key)
    except _errors() as e:
        raise _explain(uri, e) from None
