"""Import and export of embeddings in other tools' file formats (pre-trained word vectors)."""
