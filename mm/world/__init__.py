"""The synthetic note world: vocabulary, scenes, rendering, captions, questions.

``vocab`` is the single source of object names (CHAIR and POPE read it); ``generate`` turns a
:class:`~mm.world.config.WorldConfig` into :class:`~mm.data.format.Note` records with images.
"""
