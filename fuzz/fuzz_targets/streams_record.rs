#![no_main]
//! See `ddb_projector_fuzz::streams_record`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ddb_projector_fuzz::streams_record(data);
});
