//! Kafka's default partitioner, bit for bit, so that `topk run`, the load generator and a
//! Kafka producer put every key on the same logical shard.

/// Kafka's `Utils.murmur2` (seed 0x9747b28c), returned as the unsigned bit pattern of the
/// Java `int`.
pub fn murmur2(data: &[u8]) -> u32 {
    murmur2_of_parts(&[data])
}

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;

/// [`murmur2`] of the concatenation of `parts`, without assembling it.
fn murmur2_of_parts(parts: &[&[u8]]) -> u32 {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut state = Murmur2 {
        h: SEED ^ len as u32,
        word: 0,
        filled: 0,
    };
    for part in parts {
        state.write(part);
    }
    state.finish()
}

/// Murmur2 fed in pieces: whole little-endian words are mixed in as they complete.
struct Murmur2 {
    h: u32,
    /// The bytes of an incomplete word, little-endian, and how many there are.
    word: u32,
    filled: u32,
}

impl Murmur2 {
    fn mix(&mut self, mut k: u32) {
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        self.h = self.h.wrapping_mul(M) ^ k;
    }

    fn byte(&mut self, b: u8) {
        self.word |= u32::from(b) << (8 * self.filled);
        self.filled += 1;
        if self.filled == 4 {
            let word = std::mem::take(&mut self.word);
            self.filled = 0;
            self.mix(word);
        }
    }

    fn write(&mut self, mut bytes: &[u8]) {
        while self.filled != 0 {
            let Some((&b, rest)) = bytes.split_first() else {
                return;
            };
            self.byte(b);
            bytes = rest;
        }
        let mut words = bytes.chunks_exact(4);
        for w in &mut words {
            self.mix(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        }
        for &b in words.remainder() {
            self.byte(b);
        }
    }

    fn finish(mut self) -> u32 {
        // Kafka xors the one to three tail bytes in at their little-endian places: the word.
        if self.filled > 0 {
            self.h ^= self.word;
            self.h = self.h.wrapping_mul(M);
        }
        let mut h = self.h;
        h ^= h >> 13;
        h = h.wrapping_mul(M);
        h ^= h >> 15;
        h
    }
}

/// Partition of a keyed record under Kafka's default partitioner: `toPositive(murmur2) % n`.
pub fn partition_for(message_key: &[u8], partitions: u32) -> u32 {
    to_partition(murmur2(message_key), partitions)
}

/// Java's `toPositive(hash) % n`.
fn to_partition(hash: u32, partitions: u32) -> u32 {
    (hash & 0x7fff_ffff) % partitions.max(1)
}

/// The Kafka message key of an event: `metric|scope|key`.
pub fn message_key(metric: &str, scope: &str, key: &str) -> String {
    let mut out = String::with_capacity(metric.len() + scope.len() + key.len() + 2);
    out.push_str(metric);
    out.push('|');
    out.push_str(scope);
    out.push('|');
    out.push_str(key);
    out
}

/// Shard of an event: the partition of its message key, hashed in place.
pub fn shard_for(metric: &str, scope: &str, key: &str, shards: u32) -> u32 {
    let parts = [
        metric.as_bytes(),
        b"|",
        scope.as_bytes(),
        b"|",
        key.as_bytes(),
    ];
    to_partition(murmur2_of_parts(&parts), shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's own `UtilsTest.testMurmur2`, as Java signed ints.
    #[test]
    fn matches_kafka_java_vectors() {
        let cases: [(&[u8], i32); 7] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
            (&[12, 42, 56, 24, 109, 111], 274_204_207),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input) as i32, want, "{input:?}");
        }
    }

    #[test]
    fn partition_is_to_positive_mod_n() {
        // -973932308 & 0x7fffffff = 1173551340
        assert_eq!(partition_for(b"21", 1 << 31), 1_173_551_340);
        assert_eq!(partition_for(b"21", 64), 1_173_551_340 % 64);
    }

    proptest::proptest! {
        #[test]
        fn hashing_in_parts_equals_hashing_the_whole(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..9), 0..6)
        ) {
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            proptest::prop_assert_eq!(murmur2_of_parts(&slices), murmur2(&parts.concat()));
        }
    }

    #[test]
    fn shard_for_equals_partition_of_message_key() {
        let long = "x".repeat(300);
        for (m, s, k) in [
            ("api", "", "GET /"),
            ("api", "eu", "k"),
            ("m", "s", long.as_str()),
        ] {
            let want = partition_for(message_key(m, s, k).as_bytes(), 64);
            assert_eq!(shard_for(m, s, k, 64), want);
        }
    }
}
