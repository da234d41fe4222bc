#![no_main]
//! See `ddb_projector_fuzz::spec`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ddb_projector_fuzz::spec(data);
});
