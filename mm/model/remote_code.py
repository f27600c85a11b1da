"""NoteVLM's code, copied into every saved model folder so that transformers alone loads it.

transformers' custom-code mechanism (``trust_remote_code=True``): ``config.json`` names the classes in
``auto_map`` and the folder holds their modules; a module may import its siblings with ``from .x import``.
NoteVLM's code lives in the ``mm`` package, so :func:`bundle` writes each module the three entry modules
need (configuration, modeling, processing and what they import from ``mm``: vision, fusion, config,
errors) as one flat file, with ``from mm.a.b import`` rewritten to ``from .notevlm_a_b import``:

    model = AutoModelForImageTextToText.from_pretrained(folder, trust_remote_code=True)   # no notelens

Only the packages those files import are needed at load time: torch, transformers, einops, PyYAML,
safetensors, PIL, numpy; open_clip only for an open_clip vision tower (its import sits in a ``try`` block,
so transformers' import check does not demand it otherwise).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

ENTRY_MODULES = {
    "configuration_notevlm": "mm.model.configuration",
    "modeling_notevlm": "mm.model.modeling",
    "processing_notevlm": "mm.model.processing",
}
AUTO_MAP = {
    "AutoConfig": "configuration_notevlm.NoteVLMConfig",
    "AutoModel": "modeling_notevlm.NoteVLMModel",
    "AutoModelForCausalLM": "modeling_notevlm.NoteVLMForConditionalGeneration",
    "AutoModelForImageTextToText": "modeling_notevlm.NoteVLMForConditionalGeneration",
}
_FROM_MM = re.compile(r"^(\s*)from (mm(?:\.\w+)*) import ", flags=re.MULTILINE)


def _flat_name(module: str) -> str:
    """File stem (no dots) of ``module`` in a saved folder."""
    for stem, name in ENTRY_MODULES.items():
        if name == module:
            return stem
    return "notevlm_" + "_".join(module.split(".")[1:])


def _mm_imports(source: str, module: str) -> list[str]:
    """The ``mm`` modules that ``source`` imports (``from mm.x import ...`` only, at any depth)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mm" for a in node.names):
            raise ValueError(f"{module}: `import mm...` cannot be bundled; write `from mm.x import name`")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "mm":
                continue
            package = importlib.util.find_spec(node.module)
            for alias in node.names:  # `from mm import contrastive` imports a module: not bundlable
                if package is not None and package.submodule_search_locations is not None:
                    if importlib.util.find_spec(f"{node.module}.{alias.name}") is not None:
                        raise ValueError(
                            f"{module}: `from {node.module} import {alias.name}` imports a module; "
                            "import names from it instead"
                        )
            found.append(node.module)
    return found


def bundle() -> dict[str, str]:
    """File name -> source of every module the saved folder needs, imports rewritten to siblings."""
    files: dict[str, str] = {}
    todo, seen = list(ENTRY_MODULES.values()), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ValueError(f"cannot find the source of {module}")
        source = Path(spec.origin).read_text()
        todo.extend(_mm_imports(source, module))
        body = _FROM_MM.sub(lambda m: f"{m[1]}from .{_flat_name(m[2])} import ", source)
        header = f"# NoteVLM model code: a copy of `{module}` (notelens) with imports made relative.\n"
        files[f"{_flat_name(module)}.py"] = header + body
    return files


def write_remote_code(folder: str | Path) -> list[str]:
    """Write :func:`bundle`'s files into ``folder`` and ``auto_map`` into its ``config.json``."""
    d = Path(folder)
    names = []
    for name, source in sorted(bundle().items()):
        (d / name).write_text(source)
        names.append(name)
    config_file = d / "config.json"
    config = json.loads(config_file.read_text())
    config["auto_map"] = dict(AUTO_MAP)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return names
