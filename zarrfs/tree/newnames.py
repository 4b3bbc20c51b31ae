"""Where a writable mount's new names may go: the groups that take them, a new array's path, a plain file's key.

Part of the Namespace, stateless: changes (create, mkdir, mv) and arriving files (a held file
renamed to NAME.npy) check a new name here before the store changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from ..errors import Exists, InvalidArgument, NotPermitted
from ..storage.keys import join
from ..views.kinds import Kind
from .entries import NPY_SUFFIX

if TYPE_CHECKING:
    from ..formats.base import Hierarchy
    from ..model import Node
    from .entries import Entry
    from .inodes import Inodes

log = logging.getLogger(__name__)


def stems(names: Iterable[str]) -> list[str]:
    """Node names of a group's listing: NAME.npy is node NAME, a directory its own name."""
    return [n[: -len(NPY_SUFFIX)] if n.endswith(NPY_SUFFIX) else n for n in names]


class NewNames:
    """The checks a new name passes, against the format and the groups of the main tree."""

    def __init__(self, hierarchy: Hierarchy, inodes: Inodes, root_node: Callable[[], Node], root_stem: str) -> None:
        self.hierarchy = hierarchy
        self.inodes = inodes
        self.root_node = root_node  # what the root shows now (the namespace's)
        self.root_stem = root_stem  # the name of a root array (its store's)

    def group_dir(self, inode: int, plain: bool = False) -> Entry:
        """The directory `inode` if it takes new names (`plain`: plain files, which the root of a
        store whose root is an array takes when its format keeps them there)."""
        entry = self.inodes.get(inode)
        if entry.kind is not Kind.GROUP or entry.view != "":
            raise NotPermitted("only groups of the main tree take new files and directories")
        if entry.error is not None:
            raise entry.error
        if (
            entry.node is None
            and self.root_node().kind == "array"
            and not (plain and self.hierarchy.plain_files_beside_root_array)
        ):
            raise NotPermitted("a store whose root is an array holds no other nodes")
        return entry

    def array_path(self, parent_inode: int, name: str, names: Collection[str]) -> str:
        """The hierarchy path of a new array NAME.npy in a group, its name checked against the
        format and the group's listing NAMES."""
        parent = self.group_dir(parent_inode, plain=True)
        stem = name[: -len(NPY_SUFFIX)]
        if parent.node is None and self.root_node().kind == "array":  # a file renamed onto the root array
            if name != self.root_stem + NPY_SUFFIX:
                raise NotPermitted("a store whose root is an array holds no other nodes")
            return ""
        if stem in names:  # an array and a group cannot share a path
            raise Exists(name)
        self.hierarchy.check_name(stem, stems(names))
        return join(parent.node.path if parent.node else "", stem)

    def plain_key(self, parent_inode: int, name: str) -> str:
        """The store key a plain file `name` is kept under; refused (logged) when the format
        keeps none or the name could be taken for one of the format's own keys."""
        problem = self.hierarchy.plain_name_problem(name)
        parent = self.group_dir(parent_inode, plain=True)
        key = join(self.hierarchy.plain_dir(parent.node.path if parent.node else ""), name)
        if problem is not None:
            error = (InvalidArgument if self.hierarchy.keeps_plain_files else NotPermitted)(f"{key}: {problem}")
            log.warning("%s; refused", error)
            raise error
        return key
