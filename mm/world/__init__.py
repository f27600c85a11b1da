"""The synthetic note world: vocabulary, scenes, rendering, captions, questions.

``vocab`` is the single source of object names (CHAIR and POPE read it); ``generate`` turns a
:class:`~mm.world.config.WorldConfig` into :class:`~mm.data.format.Note` records with images.
``detail`` renders full-resolution photos whose tiny objects are legible only in a zoom crop, and
``change`` edits one of them for before/after photo pairs (the agent's world tasks build on both).
"""
