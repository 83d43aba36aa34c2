"""The S3 store (:class:`S3Store`) and its parts: one transport interface
(:mod:`.transport`) with two transports, boto3 (:mod:`.boto`) and the fast path
(:mod:`.fast`: SigV4 in :mod:`.sigv4`, sending in :mod:`.wire`, retries in
:mod:`.retries`); reading S3's XML (:mod:`.answers`); where clients come from
(:mod:`.source`); secret masking (:mod:`.secrets`)."""

from .store import S3Store

__all__ = ["S3Store"]
