"""NeMo ``.nemo`` archives: ``convert`` (import and export), ``archive`` (the tar, read safely), ``state`` (NeMo's
names), ``build`` (our checkpoint built from a read archive; NeMo's ``model_config.yaml`` written), ``verify``
(``import nemo --verify``). docs/INTERCHANGE.md."""
