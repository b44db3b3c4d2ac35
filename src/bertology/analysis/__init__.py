"""The analysis tools behind `python -m bertology.analyze`, one module each: contextual
similarity (`similarity`), attention maps and head statistics (`attention`), probing classifiers
(`probe`), training curves side by side (`curves`), loss surfaces (`surface`); `plots` holds what
their figures share."""
