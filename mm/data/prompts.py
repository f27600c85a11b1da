"""The prompts a NoteVLM is trained and evaluated with (training samples, CHAIR captions, POPE questions)."""

from __future__ import annotations

CAPTION_PROMPT = "Describe the note."
"""Default prompt of the captioning task (training, and CHAIR evaluation)."""

IMAGE_CAPTION_PROMPT = "Describe the photo."
"""Default prompt of the per-image captioning task."""

WORLD_POPE_TEMPLATE = "Is there a {object} in this note?"
"""POPE question template used on world models (the world's wording for a one-image note)."""
