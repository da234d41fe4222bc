#![no_main]
//! See `ddb_projector_fuzz::lambda_event`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ddb_projector_fuzz::lambda_event(data);
});
