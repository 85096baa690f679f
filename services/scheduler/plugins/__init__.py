"""The plugins, one subpackage per seed (gavel, easyscale, rubick, deeppool, dlrover), and
the registry that names them (registry), builds the stages (stages, allocators). A seed
imports no other seed (tools/check_imports.py)."""
