"""Note data: the one on-disk format, readers for COCO / LLaVA / POPE, dataset, collate, tokenizer."""
