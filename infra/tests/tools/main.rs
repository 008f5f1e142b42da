//! The local gateway's own tools, in one test binary: the admin CLI
//! (`dhukuti-admin`, run as a process) and the provider simulators
//! (against the providers' documented protocols and independent client
//! libraries in `infra/tests/clients`).

mod admin_cli;
mod admin_reconcile;
mod simulators;
mod statements;
