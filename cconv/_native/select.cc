// cconv native CPU kernels (XLA FFI): exact top-k selection by magnitude.
//
// CconvTopkIndices: for each row of x (shape (..., d)) writes the indices of the k entries of
// largest magnitude into out (shape (..., k), int32), in ASCENDING index order.
//
// Order: entries are compared by key(x) = bit pattern of |x| as an unsigned integer
// (the sign bit cleared).  For IEEE floats this is exactly the order of |x| with
// NaN > +inf > finite, subnormals kept and -0 == +0; NaNs with different payloads compare by
// payload.  Ties are broken by the lower index.  This is the total order XLA's TopK uses on
// |x|, so the selected SET equals lax.top_k(jnp.abs(x), k)[1] bit for bit (tests check it).
//
// Algorithm per row (O(d) with one streaming pass, O(k) extra memory in practice):
//   1. threshold (rows of more than 65536 entries; shorter rows make every entry a candidate):
//      the ks-th largest key of a strided sample of m ~ 4096 entries (found by the radix select
//      of step 3), where ks = e + 5 sqrt(e) + 8 and e = k m / d is the expected number of top-k
//      entries in the sample, so that at least k entries pass with overwhelming probability;
//      a small sample touches few cache lines (at d = 2^20, one in 16) and costs a fraction of
//      the pass; the price is ~2k candidates at k = d/100 instead of ~1.3k with 32768;
//   2. compaction: one streaming pass collects the indices with key >= threshold (AVX2 where the
//      CPU has it, chosen at run time: 32 keys per test, passing lanes emitted branch-free from
//      a lane table; else SSE2: 16 keys per compare into a bit mask, emitted by a nibble table;
//      elsewhere a portable loop);
//      if fewer than k pass (a sample that missed the large entries, e.g. periodic input), the
//      sample quantile is lowered 4x and the pass repeated; in the end every entry is a
//      candidate, so the result is always exact;
//   3. selection: an MSB-first radix select over the candidates' keys (the leading bits they
//      all share skipped, then 11-bit digits; after the first, only the keys of the bucket
//      holding the k-th are revisited) finds the k-th largest key K* and the number g of keys
//      above it; a branch-free scan of the candidates (already in ascending index order) emits
//      every key > K* and the first k - g keys == K*: exactly k indices, ascending, ties to the
//      lower index.
// Thread-safety: no global state; all scratch memory is per call.  Rows of a batch (vmap) are
// processed one after another.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <typename K>
constexpr K AbsMask() {
  return static_cast<K>(~(K(1) << (8 * sizeof(K) - 1)));
}

// Streaming compaction: cand[0..n) = indices i in [0, d) with (bits[i] & mask) >= thr, ascending.
// Generic version: blocks of 64 are tested with a vectorisable any() first.
template <typename K>
int64_t CompactGeneric(const K* bits, int64_t d, K thr, int32_t* cand) {
  constexpr K mask = AbsMask<K>();
  constexpr int64_t B = 64;
  int64_t n = 0;
  int64_t i = 0;
  for (; i + B <= d; i += B) {
    const K* p = bits + i;
    bool any = false;
    for (int64_t j = 0; j < B; ++j) any |= (K)(p[j] & mask) >= thr;
    if (!any) continue;
    for (int64_t j = 0; j < B; ++j) {
      cand[n] = (int32_t)(i + j);
      n += (K)(p[j] & mask) >= thr;
    }
  }
  for (; i < d; ++i) {
    cand[n] = (int32_t)i;
    n += (K)(bits[i] & mask) >= thr;
  }
  return n;
}

template <typename K>
int64_t Compact(const K* bits, int64_t d, K thr, int32_t* cand) {
  return CompactGeneric<K>(bits, d, thr, cand);
}

#if defined(__SSE2__)
// SSE2 (every x86-64 CPU): 16 keys per step, a 16-bit mask of the passing lanes, emitted
// branch-free.  Keys with the sign bit cleared are non-negative as signed integers, so the
// signed compare key > thr - 1 is key >= thr (thr = 0 gives -1: everything passes).
// Branch-free emission of the set bits of a 16-bit mask, a nibble at a time: four unconditional
// stores (positions from a table) and an advance by the nibble's popcount, so dense masks cost no
// mispredictions; all-zero masks (the common case at small k) skip.  Needs 3 slots of slack.
static const int8_t kNibblePos[16][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {2, 0, 0, 0}, {0, 2, 0, 0}, {1, 2, 0, 0}, {0, 1, 2, 0}, {3, 0, 0, 0}, {0, 3, 0, 0}, {1, 3, 0, 0}, {0, 1, 3, 0}, {2, 3, 0, 0}, {0, 2, 3, 0}, {1, 2, 3, 0}, {0, 1, 2, 3}};
static const int8_t kNibbleCount[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};

static inline int64_t EmitMask(unsigned m, int64_t base, int32_t* cand, int64_t n) {
  if (!m) return n;
  for (int q = 0; q < 4; ++q) {
    const unsigned nib = (m >> (4 * q)) & 15u;
    const int8_t* o = kNibblePos[nib];
    const int32_t b = (int32_t)(base + 4 * q);
    cand[n] = b + o[0];
    cand[n + 1] = b + o[1];
    cand[n + 2] = b + o[2];
    cand[n + 3] = b + o[3];
    n += kNibbleCount[nib];
  }
  return n;
}

static int64_t CompactSse2(const uint32_t* bits, int64_t d, uint32_t thr, int32_t* cand) {
  const __m128i mask = _mm_set1_epi32(0x7fffffff);
  const __m128i t = _mm_set1_epi32((int32_t)thr - 1);
  int64_t n = 0, i = 0;
  for (; i + 16 <= d; i += 16) {
    const __m128i* p = reinterpret_cast<const __m128i*>(bits + i);
    unsigned m = 0;
    for (int q = 0; q < 4; ++q) {
      __m128i v = _mm_and_si128(_mm_loadu_si128(p + q), mask);
      m |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, t))) << (4 * q);
    }
    n = EmitMask(m, i, cand, n);
  }
  int64_t m = CompactGeneric<uint32_t>(bits + i, d - i, thr, cand + n);  // tail, indices from 0
  for (int64_t j = 0; j < m; ++j) cand[n + j] += (int32_t)i;
  return n + m;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// AVX2 (chosen at run time: the library is built without -march): 32 keys per test; a block of
// 32 with no passing key (most blocks at small k/d) costs four compares, three ORs and one test.
// A block with passing keys is emitted branch-free, 8 keys at a time: the lanes of an 8-bit mask
// in ascending order come from a 256-entry table (kLanes), are added to the block's base index
// and stored as 8 slots, of which the first popcount(mask) are kept.  Needs 7 slots of slack.
struct LaneTable {
  alignas(32) int32_t lanes[256][8];
  int32_t count[256];
  LaneTable() {
    for (int m = 0; m < 256; ++m) {
      int c = 0;
      for (int b = 0; b < 8; ++b)
        if (m >> b & 1) lanes[m][c++] = b;
      for (int b = c; b < 8; ++b) lanes[m][b] = 0;
      count[m] = c;
    }
  }
};
static const LaneTable kLanes;

__attribute__((target("avx2"))) static inline int64_t EmitLanes(__m256i c, int64_t base, int32_t* cand, int64_t n) {
  const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(c));
  const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLanes.lanes[m]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(cand + n), _mm256_add_epi32(lanes, _mm256_set1_epi32((int32_t)base)));
  return n + kLanes.count[m];
}

__attribute__((target("avx2"))) static int64_t CompactAvx2(const uint32_t* bits, int64_t d, uint32_t thr,
                                                           int32_t* cand) {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i t = _mm256_set1_epi32((int32_t)thr - 1);
  int64_t n = 0, i = 0;
  for (; i + 32 <= d; i += 32) {
    const __m256i* p = reinterpret_cast<const __m256i*>(bits + i);
    const __m256i c0 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p), mask), t);
    const __m256i c1 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 1), mask), t);
    const __m256i c2 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 2), mask), t);
    const __m256i c3 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 3), mask), t);
    const __m256i any = _mm256_or_si256(_mm256_or_si256(c0, c1), _mm256_or_si256(c2, c3));
    if (_mm256_testz_si256(any, any)) continue;
    n = EmitLanes(c0, i, cand, n);
    n = EmitLanes(c1, i + 8, cand, n);
    n = EmitLanes(c2, i + 16, cand, n);
    n = EmitLanes(c3, i + 24, cand, n);
  }
  int64_t m = CompactSse2(bits + i, d - i, thr, cand + n);  // tail, indices from 0
  for (int64_t j = 0; j < m; ++j) cand[n + j] += (int32_t)i;
  return n + m;
}

static bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

template <>
int64_t Compact<uint32_t>(const uint32_t* bits, int64_t d, uint32_t thr, int32_t* cand) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (HasAvx2()) return CompactAvx2(bits, d, thr, cand);
#endif
  return CompactSse2(bits, d, thr, cand);
}

template <>
int64_t Compact<uint16_t>(const uint16_t* bits, int64_t d, uint16_t thr, int32_t* cand) {
  const __m128i mask = _mm_set1_epi16(0x7fff);
  const __m128i t = _mm_set1_epi16((int16_t)((int)thr - 1));
  int64_t n = 0, i = 0;
  for (; i + 16 <= d; i += 16) {
    const __m128i* p = reinterpret_cast<const __m128i*>(bits + i);
    __m128i a = _mm_cmpgt_epi16(_mm_and_si128(_mm_loadu_si128(p), mask), t);
    __m128i b = _mm_cmpgt_epi16(_mm_and_si128(_mm_loadu_si128(p + 1), mask), t);
    n = EmitMask((unsigned)_mm_movemask_epi8(_mm_packs_epi16(a, b)), i, cand, n);
  }
  int64_t m = CompactGeneric<uint16_t>(bits + i, d - i, thr, cand + n);  // tail, indices from 0
  for (int64_t j = 0; j < m; ++j) cand[n + j] += (int32_t)i;
  return n + m;
}
#endif

// The k-th largest of keys[0..n) (1 <= k <= n) by MSB-first radix selection (digits of 11 bits,
// 8 for 16-bit keys; the sign bit is clear), and in *greater the number of keys above it.
// The leading bits all keys share (one OR/AND pass) are skipped, so the first digit spreads keys
// of similar magnitude (the candidates of one row) over its buckets; that digit's histogram
// pass reads every key; the keys of the bucket holding the k-th are then copied out, so later
// digits only touch that (small) bucket.  Histograms fit in L1.
template <typename K>
K KthLargestKey(const K* keys, int64_t n, int64_t k, int64_t* greater) {
  constexpr int W = sizeof(K) == 2 ? 8 : 11;
  K any = 0, all = (K)~K(0);
  for (int64_t j = 0; j < n; ++j) {
    any = (K)(any | keys[j]);
    all = (K)(all & keys[j]);
  }
  int kBits = 0;  // the low bits in which some keys differ
  while (kBits < 8 * (int)sizeof(K) && ((K)(any ^ all) >> kBits) != 0) ++kBits;
  std::vector<int64_t> hist(size_t(1) << W);
  std::vector<K> sub;
  const K* cur = keys;
  int64_t m = n;
  K prefix = kBits == 8 * (int)sizeof(K) ? 0 : (K)(all & (K)~((K(1) << kBits) - 1));  // the shared bits
  int64_t above = 0;
  for (int remaining = kBits; remaining > 0;) {
    const int w = std::min(W, remaining);
    const int shift = remaining - w;
    const K dmask = (K)((K(1) << w) - 1);
    std::fill(hist.begin(), hist.begin() + (int64_t(1) << w), 0);
    for (int64_t j = 0; j < m; ++j) ++hist[(cur[j] >> shift) & dmask];  // cur: keys with this prefix
    int64_t b = (int64_t(1) << w) - 1;
    for (; b > 0 && above + hist[b] < k; --b) above += hist[b];
    prefix = (K)(prefix | ((K)b << shift));
    remaining = shift;
    if (remaining > 0) {  // keep only the keys of bucket b for the next digit
      std::vector<K> next;
      next.reserve(hist[b]);
      for (int64_t j = 0; j < m; ++j)
        if ((int64_t)((cur[j] >> shift) & dmask) == b) next.push_back(cur[j]);
      sub.swap(next);
      cur = sub.data();
      m = (int64_t)sub.size();
    }
  }
  *greater = above;
  return prefix;
}

// Rows longer than kSampledAbove estimate the threshold from a strided sample of about kSample
// entries (step 1 of the header); shorter rows make every entry a candidate.  The tests build
// inputs whose sample misses the tail from these two numbers (tests/test_select.py).
constexpr int64_t kSample = 4096;
constexpr int64_t kSampledAbove = 65536;

template <typename K>
void SelectRow(const K* bits, int64_t d, int64_t k, int32_t* out, std::unique_ptr<int32_t[]>& cand_buf) {
  constexpr K mask = AbsMask<K>();
  if (k <= 0) return;
  if (k >= d) {
    for (int64_t i = 0; i < d; ++i) out[i] = (int32_t)i;
    return;
  }
  int32_t* cand = nullptr;
  int64_t n = 0;
  if (d > kSampledAbove) {
    if (!cand_buf) cand_buf.reset(new int32_t[d + 16]);  // uninitialised: pages are touched only as used
    cand = cand_buf.get();
    const int64_t stride = d / kSample;
    std::vector<K> sample;
    sample.reserve(kSample + 1);
    for (int64_t i = stride / 2; i < d; i += stride) sample.push_back((K)(bits[i] & mask));
    const int64_t m = (int64_t)sample.size();
    const double e = (double)k * (double)m / (double)d;
    int64_t ks = (int64_t)std::ceil(e + 5.0 * std::sqrt(e) + 8.0);
    while (ks < m) {
      int64_t above = 0;
      const K thr = KthLargestKey<K>(sample.data(), m, ks, &above);  // the ks-th largest sampled key
      n = Compact<K>(bits, d, thr, cand);
      if (n >= k) break;
      ks *= 4;  // the sample under-estimated the tail: lower the threshold and rescan
    }
    if (ks >= m) n = 0;  // fall through to "every entry is a candidate"
  }
  // Keys of the candidates (in ascending index order), or of every entry.
  std::vector<K> keys;
  if (n >= k) {
    keys.resize(n);
    for (int64_t j = 0; j < n; ++j) keys[j] = (K)(bits[cand[j]] & mask);
  } else {
    cand = nullptr;
    n = d;
    keys.resize(d);
    for (int64_t i = 0; i < d; ++i) keys[i] = (K)(bits[i] & mask);
  }
  int64_t greater = 0;
  const K kth = KthLargestKey<K>(keys.data(), n, k, &greater);
  // Emit, in ascending index order, every key above the k-th and the lowest-index ties: exactly k.
  // Branch-free: every step stores into out[w] (w < k) and advances w when the key is taken.
  int64_t ties = k - greater;
  int64_t w = 0;
  for (int64_t j = 0; j < n && w < k; ++j) {
    const K key = keys[j];
    const int64_t tie = (key == kth) & (ties > 0);
    const int64_t take = (key > kth) | tie;
    out[w] = cand ? cand[j] : (int32_t)j;
    w += take;
    ties -= tie;
  }
}

template <typename K>
void SelectRows(const void* data, int64_t rows, int64_t d, int64_t k, int32_t* out) {
  const K* bits = static_cast<const K*>(data);
  std::unique_ptr<int32_t[]> cand_buf;
  for (int64_t r = 0; r < rows; ++r) SelectRow<K>(bits + r * d, d, k, out + r * k, cand_buf);
}

ffi::Error TopkIndicesImpl(ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::S32>> out) {
  auto xdims = x.dimensions();
  auto odims = out->dimensions();
  if (xdims.size() < 1 || xdims.size() != odims.size())
    return ffi::Error::InvalidArgument("cconv_topk_indices: input and output must have the same rank >= 1");
  int64_t rows = 1;
  for (size_t a = 0; a + 1 < xdims.size(); ++a) {
    if (xdims[a] != odims[a])
      return ffi::Error::InvalidArgument("cconv_topk_indices: leading (batch) dimensions differ");
    rows *= xdims[a];
  }
  const int64_t d = xdims.back();
  const int64_t k = odims.back();
  if (k > d) return ffi::Error::InvalidArgument("cconv_topk_indices: k > d");
  if (d > INT32_MAX) return ffi::Error::InvalidArgument("cconv_topk_indices: d must fit int32");
  int32_t* o = out->typed_data();
  switch (x.element_type()) {
    case ffi::DataType::F32:
      SelectRows<uint32_t>(x.untyped_data(), rows, d, k, o);
      break;
    case ffi::DataType::BF16:
    case ffi::DataType::F16:
      SelectRows<uint16_t>(x.untyped_data(), rows, d, k, o);
      break;
    case ffi::DataType::F64:
      SelectRows<uint64_t>(x.untyped_data(), rows, d, k, o);
      break;
    default:
      return ffi::Error::InvalidArgument("cconv_topk_indices: dtype must be float32, bfloat16, float16 or float64");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CconvTopkIndices, TopkIndicesImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::Buffer<ffi::S32>>());

// ABI version of this source, checked by the loader after dlopen.
extern "C" int cconv_native_abi_version() { return 1; }
