pub mod placeholder_for_build {}
