//! The projection lifecycle: which definitions of each projection wrote the
//! derived data in the table, whether a backfill brought all of it to the
//! spec's definition, and what a deploy needs next.
//!
//! Everything is kept in the table, under the reserved partition
//! `_ddbp#lifecycle` (tables without a sort key: `_ddbp#lifecycle#<sk>`):
//!
//! - **Leases** (sort key `leases`, one item). Every process that writes
//!   derived data (the Lambda, the runner, `backfill`, `replay`, `dlq
//!   redrive`, `recover`) first takes a lease for each projection it writes
//!   and the fingerprint of the definition it writes it with:
//!   `w#<fingerprint>#<projection>` holds the time (ms) until which it may
//!   write. A stream consumer (the Lambda, the runner) also writes
//!   `c#…` (the same time), `s#…` (when one first ran it), and for its
//!   spec `C#<fp>`, `S#<fp>` and `N#<fp>` (its lease, first run and
//!   projection names; `<fp>@<consumer>` for a named consumer): a
//!   consumer without a projection leaves that projection's changes
//!   unprojected, which [`states`] reads as a definition `-` of it. A
//!   writer renews its lease before a batch that could
//!   outlast it, so a batch needs no request of its own
//!   ([`Leases::ensure`]); it never writes past its lease.
//! - **Projection records** (sort key `p#<projection>`): the backfill under
//!   way (`claimRun`, `claimFp`, `claimFromMs`) and the last complete one
//!   (`doneRun`, `doneFp`, `doneFromMs`, `doneAtMs`).
//! - **Spec texts** (sort key `spec#<fingerprint of the spec>`): the spec a
//!   lease's definition came from (`d#…` names it), so that `prune` can
//!   remove what a projection that no spec file has any more derived.
//!
//! **Architecture Invariant:** a projection is *live* only when a backfill
//! of its definition `f` completed, a stream consumer runs `f`, and no
//! lease of any other definition (nor of a consumer without it) lasted
//! past the instant the backfill started. Every item's derived data was
//! then written by `f`: the backfill brought each item to `f` after every
//! other writer had stopped, and only writers of `f` wrote since. `status`
//! computes this from the leases at every call ([`states`]), so a writer of
//! another definition that runs later (a rollback, a stale environment, a
//! redrive with an old spec file) turns the projection back from live at
//! once; nothing has to remember to clear a flag.

mod layout;
mod leases;
mod registry;
mod status;

pub use layout::{current_layout, layout_refusals, CounterLayout, OldVersion};
pub use leases::Leases;
pub use registry::{ClaimOutcome, Completion, Registry, LEASES_VERSION};
pub use status::{
    hex, iso, states, Applied, BackfillRun, Commands, ConsumerSpec, Definition, ProjectionStatus,
    ReadVersion, Record, Snapshot, State, WITHOUT,
};
