"""GPU names: the one table from the name a config writes to each provider's own identifier.

A queue's `instance.gpu` (and a RunPod provider's `gpu_types`) may be written as the table's name
("RTX 4090"), RunPod's GPU id ("NVIDIA GeForce RTX 4090") or Vast's `gpu_name` ("RTX 4090"),
in any case and with or without spaces, underscores and hyphens ("rtx_4090" is Vast's CLI
spelling). `lookup` finds the entry; each provider then asks for its own identifier.

Origin (facts only: names and memory sizes), gathered on 2026-12-02:

- RunPod: the GPU types reference, https://docs.runpod.io/references/gpu-types (repository
  runpod/docs, `references/gpu-types.mdx`, as of commit 21ae706 of 2026-08-18, its table
  generated 2026-02-12): GPU ID (what a create takes), display name, memory in GB. Ids that
  earlier versions of the page listed and the current one dropped (Tesla V100-FHHL-16GB) are
  kept: a pod type leaves the page before it leaves the catalog. RunPod's display names are
  the table's names, except "A100 80GB" (displayed "A100 PCIe", which Vast's "A100 PCIE"
  spells too) and "H200 NVL" (displayed as its id); every display name still looks up.
- Vast.ai: the GPU name constants of the official CLI (repository vast-ai/vast-cli,
  `vastai/data/query.py`, as of commit a501c00 of 2026-05-04, taken from Vast's own GPU
  list), checked against the `--gpu-name` choices of vast-ai/docs
  `cli/reference/launch-instance.mdx` (2026-04-03) and the RunPod-to-Vast migration guide of
  the same docs (A100 SXM4 / A100 PCIE, H100 SXM). The API takes them with spaces; the CLI
  writes underscores for the spaces. Vast's list gives no memory: `memory_gb` is RunPod's
  figure, None for a GPU only Vast lists (a Vast offer says its own, `gpu_ram`).

Judgements where the catalogs do not line up one to one:

- Vast's "A100 PCIE", "A100 SXM4" and "Tesla V100" do not tell the memory apart (40/80 GB,
  16/32 GB); they are mapped to RunPod's 80 GB A100s and its PCIe V100.
- Vast lists "A100 SXM" beside "A100 SXM4", and "RTX PRO 6000" beside "RTX PRO 6000 S"/"WS":
  their spellings are the names of RunPod's "A100 SXM" and "RTX PRO 6000" (Server Edition), so
  they look those entries up and search Vast for "A100 SXM4" and "RTX PRO 6000 S".
- RunPod's "RTX PRO 6000" is its Server Edition (Vast's "S"), "RTX PRO 6000 WK" its Workstation
  Edition (Vast's "WS").

A GPU a catalog adds later is refused by `autoscaler validate` until it is added here: add a
row (the three spellings, and where they were read) and keep the origin above up to date.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """One GPU model: the name a config writes, RunPod's GPU id and Vast's `gpu_name` (None
    where that provider does not offer it), and its memory in GB (None where unknown)."""

    name: str
    runpod: str | None
    vast: str | None
    memory_gb: int | None


_BOTH: tuple[Gpu, ...] = (
    # name, RunPod's GPU id, Vast's gpu_name, memory (GB, RunPod's)
    Gpu("MI300X", "AMD Instinct MI300X OAM", None, 192),
    Gpu("A100 80GB", "NVIDIA A100 80GB PCIe", "A100 PCIE", 80),
    Gpu("A100 SXM", "NVIDIA A100-SXM4-80GB", "A100 SXM4", 80),
    Gpu("A30", "NVIDIA A30", "A30", 24),
    Gpu("A40", "NVIDIA A40", "A40", 48),
    Gpu("B200", "NVIDIA B200", "B200", 180),
    Gpu("B300", "NVIDIA B300 SXM6 AC", None, 288),
    Gpu("RTX 3070", "NVIDIA GeForce RTX 3070", "RTX 3070", 8),
    Gpu("RTX 3080", "NVIDIA GeForce RTX 3080", "RTX 3080", 10),
    Gpu("RTX 3080 Ti", "NVIDIA GeForce RTX 3080 Ti", "RTX 3080 Ti", 12),
    Gpu("RTX 3090", "NVIDIA GeForce RTX 3090", "RTX 3090", 24),
    Gpu("RTX 3090 Ti", "NVIDIA GeForce RTX 3090 Ti", "RTX 3090 Ti", 24),
    Gpu("RTX 4070 Ti", "NVIDIA GeForce RTX 4070 Ti", "RTX 4070 Ti", 12),
    Gpu("RTX 4080", "NVIDIA GeForce RTX 4080", "RTX 4080", 16),
    Gpu("RTX 4080 SUPER", "NVIDIA GeForce RTX 4080 SUPER", "RTX 4080S", 16),
    Gpu("RTX 4090", "NVIDIA GeForce RTX 4090", "RTX 4090", 24),
    Gpu("RTX 5080", "NVIDIA GeForce RTX 5080", "RTX 5080", 16),
    Gpu("RTX 5090", "NVIDIA GeForce RTX 5090", "RTX 5090", 32),
    Gpu("H100 SXM", "NVIDIA H100 80GB HBM3", "H100 SXM", 80),
    Gpu("H100 NVL", "NVIDIA H100 NVL", "H100 NVL", 94),
    Gpu("H100 PCIe", "NVIDIA H100 PCIe", "H100 PCIE", 80),
    Gpu("H200 SXM", "NVIDIA H200", "H200", 141),
    Gpu("H200 NVL", "NVIDIA H200 NVL", "H200 NVL", 143),
    Gpu("L4", "NVIDIA L4", "L4", 24),
    Gpu("L40", "NVIDIA L40", "L40", 48),
    Gpu("L40S", "NVIDIA L40S", "L40S", 48),
    Gpu("RTX 2000 Ada", "NVIDIA RTX 2000 Ada Generation", "RTX 2000Ada", 16),
    Gpu("RTX 4000 Ada", "NVIDIA RTX 4000 Ada Generation", "RTX 4000Ada", 20),
    Gpu("RTX 4000 Ada SFF", "NVIDIA RTX 4000 SFF Ada Generation", None, 20),
    Gpu("RTX 5000 Ada", "NVIDIA RTX 5000 Ada Generation", "RTX 5000Ada", 32),
    Gpu("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", "RTX 6000Ada", 48),
    Gpu("RTX A2000", "NVIDIA RTX A2000", "RTX A2000", 6),
    Gpu("RTX A4000", "NVIDIA RTX A4000", "RTX A4000", 16),
    Gpu("RTX A4500", "NVIDIA RTX A4500", "RTX A4500", 20),
    Gpu("RTX A5000", "NVIDIA RTX A5000", "RTX A5000", 24),
    Gpu("RTX A6000", "NVIDIA RTX A6000", "RTX A6000", 48),
    Gpu("RTX PRO 4500", "NVIDIA RTX PRO 4500 Blackwell", "RTX PRO 4500", 32),
    Gpu(
        "RTX PRO 6000 MaxQ",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "RTX PRO 6000 Max-Q",
        96,
    ),
    Gpu("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 S", 96),
    Gpu(
        "RTX PRO 6000 WK",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "RTX PRO 6000 WS",
        96,
    ),
    Gpu("PRO 6000 MIG 24GB", "NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb", None, 24),
    Gpu("PRO 6000 MIG 48GB", "NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 2g.48gb", None, 48),
    Gpu("Tesla V100", "Tesla V100-PCIE-16GB", "Tesla V100", 16),
    Gpu("V100 SXM2", "Tesla V100-SXM2-16GB", None, 16),
    Gpu("V100 SXM2 32GB", "Tesla V100-SXM2-32GB", None, 32),
    Gpu("V100 FHHL", "Tesla V100-FHHL-16GB", None, 16),
)
"""RunPod's GPU types, with Vast's name for the same GPU where it lists one."""

_VAST_ONLY: tuple[str, ...] = (
    # data centre
    "A10", "A10g", "A16", "A100X", "A800 PCIE", "GH200 SXM",
    "Tesla K20c", "Tesla K80", "Tesla M40", "Tesla P4", "Tesla P6", "Tesla P40", "Tesla P100",
    "Tesla T4",
    # GeForce
    "GeForce 970", "GTX 750 Ti", "GTX 1050", "GTX 1050 Ti", "GTX 1060", "GTX 1070",
    "GTX 1070 Ti", "GTX 1080", "GTX 1080 Ti", "GTX 1650", "GTX 1650 S", "GTX 1650 Ti",
    "GTX 1660", "GTX 1660 S", "GTX 1660 Ti", "GTX TITAN X",
    "RTX 2060", "RTX 2060S", "RTX 2070", "RTX 2070S", "RTX 2080", "RTX 2080S", "RTX 2080 Ti",
    "RTX 3050", "RTX 3060", "RTX 3060 laptop", "RTX 3060 Ti", "RTX 3070 laptop", "RTX 3070 Ti",
    "RTX 4060", "RTX 4060 laptop", "RTX 4060 Ti", "RTX 4070", "RTX 4070 laptop", "RTX 4070S",
    "RTX 4070S Ti", "RTX 4080 laptop", "RTX 4090D", "RTX 4090 Ti",
    "RTX 5060", "RTX 5060 Ti", "RTX 5070", "RTX 5070 Ti", "RTX 5090 Ti",
    "Titan RTX", "Titan V", "TITAN V CEO", "Titan X", "Titan Xp",
    # professional
    "Quadro K620", "Quadro K2200", "Quadro P2000", "Quadro P4000", "Quadro P5000",
    "Quadro P6000", "Quadro GP100", "Quadro GV100",
    "Q RTX 4000", "Q RTX 5000", "Q RTX 6000", "Q RTX 8000",
    "RTX 4500Ada", "RTX 5880Ada", "RTX PRO 4000", "RTX PRO 4000 Mobile", "RTX PRO 5000",
    # other NVIDIA
    "CMP 50HX", "CMP 170HX", "P104-100", "P106-100",
    # AMD
    "InstinctMI50", "InstinctMI100", "InstinctMI210", "InstinctMI250X",
    "PRO W6800", "PRO W7800", "PRO W7900", "Pro V620", "Radeon VII", "Radeon Pro VII",
    "RX 6800", "RX 6800 XT", "RX 6900 XT", "RX 6950 XT", "RX 7600", "RX 7700 XT", "RX 7800 XT",
    "RX 7900 GRE", "RX 7900 XT", "RX 7900 XTX",
)  # fmt: skip
"""GPUs Vast lists and RunPod does not: the table's name is Vast's."""

GPUS: tuple[Gpu, ...] = _BOTH + tuple(Gpu(v, None, v, None) for v in _VAST_ONLY)
"""Every GPU a config may name for RunPod or Vast (see the module's docstring for the origin)."""

WHERE = "the GPU table in autoscaler/config/gpus.py (RunPod's and Vast's catalogs, 2026-12-02)"
"""Where a refusal sends whoever wrote a name the table does not know."""

_SEPARATORS = re.compile(r"[\s_\-]+")


def _key(name: str) -> str:
    """A spelling as compared: case-folded, without spaces, underscores and hyphens."""
    return _SEPARATORS.sub("", name).casefold()


def _spellings(gpu: Gpu) -> tuple[str, ...]:
    return tuple(s for s in (gpu.name, gpu.runpod, gpu.vast) if s is not None)


def _index() -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for gpu in GPUS:
        for spelling in _spellings(gpu):
            index.setdefault(_key(spelling), gpu)  # a clash is a test's failure, not a crash
    return index


_INDEX = _index()


def lookup(name: str) -> Gpu | None:
    """The entry that `name` spells (table name, RunPod id or Vast name), or None."""
    return _INDEX.get(_key(name))


def canonical(name: str) -> str:
    """The table's name for any spelling of a known GPU, else `name` as written."""
    gpu = lookup(name)
    return gpu.name if gpu is not None else name


def suggest(name: str, n: int = 3) -> list[str]:
    """Up to `n` table names close to `name` (did you mean …): first the spellings that
    contain it ("A100", "4090"), the shortest first, then difflib's closest."""
    key = _key(name)
    within = sorted((k for k in _INDEX if len(key) >= 2 and key in k), key=len)
    close = difflib.get_close_matches(key, list(_INDEX), n=n * 4, cutoff=0.6)
    names: list[str] = []
    for k in within + close:
        if _INDEX[k].name not in names:
            names.append(_INDEX[k].name)
    return names[:n]
