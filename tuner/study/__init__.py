"""A study as written: the spec (``spec``), its search space (``space``), the space's expressions
(``expr``) and the YAML/JSON reading and writing (``yamlio``). The bottom layer: ``space``, ``expr`` and
``yamlio`` import nothing else of tuner; ``spec`` checks a spec against its workload's contract."""
