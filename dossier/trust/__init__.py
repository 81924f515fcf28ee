"""Trust: keys, provenance statements and DSSE signatures (:mod:`.signing`), the envelope
models (:mod:`.dsse`) and where a bundle's signature lives (:mod:`.sigfile`)."""
