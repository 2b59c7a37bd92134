"""What both stages share: paths, errors, atomic writes, provenance, the
artifact manifest, checkpoint checks, dtype and machine facts, the Hydra job
wrapper, assets. Nothing here imports a stage (`quantize.*` outside this
package, or `evaluate`): both stages depend on it, never the reverse."""
