"""The R-GCN entity-classification graphs (AIFB and friends) from their N-Triples dumps.

As in the R-GCN paper (Schlichtkrull et al. 2018) and PyG's ``Entities`` dataset: every
distinct subject and object (literals included) is a node, every predicate a relation, and
each triple gives two edges, ``s -> o`` with relation ``2p`` and ``o -> s`` with ``2p + 1``
(the inverse relation). Labels and the train/test split come from the TSV files next to the
dump (``trainingSet.tsv`` / ``testSet.tsv``: the entity in column 0, its label in the last).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import torch


@dataclass
class RdfGraph:
    edge_index: torch.Tensor   # [2, 2T]: sources, targets
    edge_type: torch.Tensor    # [2T]
    num_nodes: int
    num_relations: int
    train_idx: torch.Tensor
    train_y: torch.Tensor
    test_idx: torch.Tensor
    test_y: torch.Tensor
    num_classes: int


def _split_triple(line: str) -> Tuple[str, str, str]:
    line = line.strip()
    if line.endswith("."):
        line = line[:-1].rstrip()
    s, rest = line.split(" ", 1)
    p, o = rest.split(" ", 1)
    return s, p, o.strip()


def _read_split(path: Path, node_of: Dict[str, int], label_of: Dict[str, int]):
    idx: List[int] = []
    ys: List[int] = []
    with open(path) as f:
        next(f)  # header
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 2:
                continue
            key = "<" + cols[0] + ">"
            if key not in node_of:
                continue
            idx.append(node_of[key])
            ys.append(label_of.setdefault(cols[-1], len(label_of)))
    return torch.tensor(idx, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


def load_rdf(folder: Path, dump: str = "aifb_stripped.nt.gz",
             drop_predicates: Tuple[str, ...] = ()) -> RdfGraph:
    """Reads ``folder/dump`` (gzipped N-Triples) and the split TSVs beside it."""
    folder = Path(folder)
    node_of: Dict[str, int] = {}
    rel_of: Dict[str, int] = {}
    src: List[int] = []
    dst: List[int] = []
    rel: List[int] = []
    with gzip.open(folder / dump, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            s, p, o = _split_triple(line)
            if p in drop_predicates:
                continue
            si = node_of.setdefault(s, len(node_of))
            oi = node_of.setdefault(o, len(node_of))
            pi = rel_of.setdefault(p, len(rel_of))
            src.append(si)
            dst.append(oi)
            rel.append(pi)
    s_t, d_t, r_t = (torch.tensor(v, dtype=torch.long) for v in (src, dst, rel))
    edge_index = torch.cat([torch.stack([s_t, d_t]), torch.stack([d_t, s_t])], dim=1)
    edge_type = torch.cat([2 * r_t, 2 * r_t + 1])
    label_of: Dict[str, int] = {}
    train_idx, train_y = _read_split(folder / "trainingSet.tsv", node_of, label_of)
    test_idx, test_y = _read_split(folder / "testSet.tsv", node_of, label_of)
    return RdfGraph(edge_index, edge_type, len(node_of), 2 * len(rel_of), train_idx, train_y,
                    test_idx, test_y, len(label_of))
