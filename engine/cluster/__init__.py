"""A histlog cluster: servers of one ``--group`` split the topic's partitions (issue 14, DESIGN.md §9).

* ``ownership``: ``OwnershipMap``, partition -> owner URL as a member last learned it.
* ``assignor``: ``OwnershipAssignor``, cooperative-sticky placement carrying members' URLs.
* ``membership``: ``Membership``, a member of the Kafka consumer group that decides ownership.

The routing of requests by the map is ``engine.service.routing`` and ``engine.service.forward``.
"""

from engine.cluster.assignor import OwnershipAssignor
from engine.cluster.membership import Membership
from engine.cluster.ownership import OwnershipMap

__all__ = ["Membership", "OwnershipAssignor", "OwnershipMap"]
