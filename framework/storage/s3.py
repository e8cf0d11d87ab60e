"""s3fs trying each request once: botocore's own retry mode repeats it (framework.storage.timeouts sets how often and
how long each attempt waits), and s3fs's loop around botocore would repeat each of those attempts five times more
(a bucket behind an endpoint that never answers failed a job after ~7 minutes, not after its timeouts).
framework.storage.timeouts registers this class for s3:// and s3a://."""
from __future__ import annotations

import s3fs


class S3FileSystem(s3fs.S3FileSystem):
    retries = 1         # s3fs's attempts of a call, around botocore's (see the module's docstring)
