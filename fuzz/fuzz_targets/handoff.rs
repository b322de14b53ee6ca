#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topk_fuzz_cases::handoff(data));
