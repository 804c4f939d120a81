"""histlog's cluster (SERVICE.md "Cluster"): servers of one ``--group`` split a Kafka topic's
partitions and route each request to its partition's owner.

- ``ownership``: ``OwnershipMap``, partition -> owner URL, as a member last learned it.
"""

from engine.cluster.ownership import OwnershipMap

__all__ = ["OwnershipMap"]
