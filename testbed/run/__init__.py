"""Running campaigns: the loop and its lanes (``loop``), the contract with the runner
(``contract``), the episode runner (``episode``), the node processes (``team``) and the
validity verdict from the owners' head logs (``verdict``)."""
