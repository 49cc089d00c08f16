//! How one request's token rows are cut into passes. A pass pads every row to its longest
//! (`"longest"` padding), so rows are taken shortest first: each pass holds rows of nearly
//! one length, and one long document no longer makes every short one beside it cost its
//! length (32 short rows and one of 512 tokens in arrival order cost 33 × 512). A pass holds
//! at most the token budget (`max_batch_tokens`: rows × padded length), so a pass of long
//! rows holds fewer of them; a single row longer than the budget runs alone. The answer
//! keeps the request's order: each pass says which rows it holds.
//!
//! Where the sorted rows are cut: with a pass's own cost given (on the CPU, where a pass
//! costs about what its padded tokens cost, plus a fixed part), where padded tokens plus
//! that cost a pass are fewest ([`cheapest`]: 16 rows of 10 to 256 tokens cost 16 × 256 in
//! one pass, about 2,000 tokens in five); else (on a GPU, where many small passes cost more
//! than their padding) as few passes as the budget and the rows' cap allow.

/// The passes over rows of `lengths` tokens: shortest rows first, at most `max_rows` rows
/// each and, with a budget of `tokens`, at most that many tokens once padded (to the pass's
/// longest row, or to `width` for `"max_length"` padding), cut where padded tokens plus
/// `pass_cost` tokens a pass are fewest when it is given, else into as few passes as fit;
/// each pass lists its rows' indices (into `lengths`), shortest first.
pub fn by_length(
    lengths: &[usize],
    max_rows: usize,
    tokens: Option<usize>,
    width: Option<usize>,
    pass_cost: Option<usize>,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: rows of one length keep their order.
    order.sort_by_key(|&i| lengths[i]);
    let sorted: Vec<usize> = order.iter().map(|&i| lengths[i]).collect();
    let fits = Fits {
        max_rows: max_rows.max(1),
        budget: tokens.unwrap_or(usize::MAX),
        width,
    };
    let ends = match pass_cost {
        Some(cost) => cheapest(&sorted, &fits, cost),
        None => fewest(&sorted, &fits),
    };
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let pass = order[start..end].to_vec();
            start = end;
            pass
        })
        .collect()
}

/// What one pass may hold.
struct Fits {
    max_rows: usize,
    budget: usize,
    width: Option<usize>,
}

impl Fits {
    /// The padded tokens of `rows` sorted rows whose longest is `longest`, when they fit in
    /// one pass (one row always does).
    fn padded(&self, rows: usize, longest: usize) -> Option<usize> {
        let padded = rows.saturating_mul(self.width.unwrap_or(longest));
        (rows == 1 || (rows <= self.max_rows && padded <= self.budget)).then_some(padded)
    }
}

/// Where the passes over `sorted` rows end: each takes rows while they fit.
fn fewest(sorted: &[usize], fits: &Fits) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut start = 0;
    for end in 1..=sorted.len() {
        if fits.padded(end - start, sorted[end - 1]).is_none() {
            ends.push(end - 1);
            start = end - 1;
        }
    }
    if !sorted.is_empty() {
        ends.push(sorted.len());
    }
    ends
}

/// Where the passes over `sorted` rows end so that their padded tokens, plus `cost` a pass,
/// are fewest (each pass fitting): the cheapest cut of every prefix, from the shorter ones.
fn cheapest(sorted: &[usize], fits: &Fits, cost: usize) -> Vec<usize> {
    let n = sorted.len();
    // best[j]: the least cost of the first j rows, and where its last pass starts.
    let mut best: Vec<(usize, usize)> = vec![(0, 0); n + 1];
    for j in 1..=n {
        best[j] = (usize::MAX, j - 1);
        for i in (0..j).rev() {
            let Some(padded) = fits.padded(j - i, sorted[j - 1]) else {
                // More rows only pad more: no earlier start fits either.
                break;
            };
            let total = best[i].0.saturating_add(padded).saturating_add(cost);
            if total < best[j].0 {
                best[j] = (total, i);
            }
        }
    }
    let mut ends = Vec::new();
    let mut end = n;
    while end > 0 {
        ends.push(end);
        end = best[end].1;
    }
    ends.reverse();
    ends
}

/// Tokens given to the model by one pass of rows of `lengths` tokens padded to `width`:
/// (real, padded), the padding efficiency being real ÷ padded.
pub fn tokens(lengths: impl Iterator<Item = usize>, width: Option<usize>) -> (u64, u64) {
    let (mut real, mut rows, mut longest) = (0u64, 0u64, 0usize);
    for l in lengths {
        real += l as u64;
        rows += 1;
        longest = longest.max(l);
    }
    (real, rows * width.unwrap_or(longest) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_taken_shortest_first_and_every_row_once() {
        let lengths = [9, 2, 30, 2, 5, 9, 1];
        let passes = by_length(&lengths, 3, None, None, None);
        assert_eq!(passes, vec![vec![6, 1, 3], vec![4, 0, 5], vec![2]]);
        let mut all: Vec<usize> = passes.concat();
        all.sort_unstable();
        assert_eq!(all, (0..lengths.len()).collect::<Vec<_>>());
    }

    #[test]
    fn sorting_pads_less_than_arrival_order() {
        // Short and long alternating: in arrival order every pass pads to the long one.
        let lengths: Vec<usize> = (0..32).map(|i| if i % 2 == 0 { 4 } else { 100 }).collect();
        let padded = |passes: Vec<Vec<usize>>| -> u64 {
            passes
                .iter()
                .map(|p| tokens(p.iter().map(|&i| lengths[i]), None).1)
                .sum()
        };
        let arrival: Vec<Vec<usize>> = (0..32)
            .collect::<Vec<_>>()
            .chunks(8)
            .map(<[usize]>::to_vec)
            .collect();
        assert_eq!(padded(arrival), 32 * 100);
        assert_eq!(
            padded(by_length(&lengths, 8, None, None, None)),
            16 * 4 + 16 * 100
        );
    }

    #[test]
    fn a_pass_never_holds_more_tokens_than_the_budget_but_a_long_row_runs_alone() {
        let lengths = [10, 3, 50, 10, 10, 4, 10, 200];
        let passes = by_length(&lengths, 8, Some(40), None, None);
        assert_eq!(
            passes,
            vec![vec![1, 5, 0, 3], vec![4, 6], vec![2], vec![7]],
            "3, 4, 10, 10 (40 padded); the other two of 10; 50 and 200 alone"
        );
        for p in &passes {
            let (_, padded) = tokens(p.iter().map(|&i| lengths[i]), None);
            assert!(padded <= 40 || p.len() == 1, "{p:?}");
        }
        // With "max_length" padding every row costs the width.
        let fixed = by_length(&[1, 2, 3, 4, 5], 8, Some(64), Some(32), None);
        assert_eq!(fixed, vec![vec![0, 1], vec![2, 3], vec![4]]);
        // The rows' cap still holds under a large budget.
        assert_eq!(by_length(&[1; 5], 2, Some(1000), None, None).len(), 3);
    }

    #[test]
    fn with_a_pass_cost_the_cut_pads_least_and_still_fits() {
        // 16 rows of mixed lengths, two at 256: in one pass they pad to 16 × 256.
        let lengths = [
            256, 12, 40, 9, 200, 65, 30, 18, 256, 100, 50, 15, 80, 150, 22, 120,
        ];
        let padded = |passes: &[Vec<usize>]| -> usize {
            passes
                .iter()
                .map(|p| p.len() * p.iter().map(|&i| lengths[i]).max().unwrap())
                .sum()
        };
        let one = by_length(&lengths, 16, None, None, None);
        assert_eq!((one.len(), padded(&one)), (1, 16 * 256));
        let cut = by_length(&lengths, 16, None, None, Some(64));
        let cost = |passes: &[Vec<usize>]| padded(passes) + 64 * passes.len();
        assert!(
            cost(&cut) < cost(&one) && padded(&cut) < 2200,
            "{cut:?}: {} padded tokens",
            padded(&cut)
        );
        // Every row once, each pass shortest first and longer than the one before.
        let mut all: Vec<usize> = cut.concat();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
        // No cut of the sorted rows is cheaper (all 2^15 of them tried).
        let mut sorted = lengths.to_vec();
        sorted.sort_unstable();
        let least = (0u32..1 << 15)
            .map(|mask| {
                let (mut total, mut start) = (0, 0);
                for end in 1..=16 {
                    if end == 16 || mask & (1 << (end - 1)) != 0 {
                        total += (end - start) * sorted[end - 1] + 64;
                        start = end;
                    }
                }
                total
            })
            .min()
            .unwrap();
        assert_eq!(cost(&cut), least);
        // The budget and the rows' cap still hold; a row over the budget runs alone.
        for p in by_length(&lengths, 3, Some(300), None, Some(64)) {
            let longest = p.iter().map(|&i| lengths[i]).max().unwrap();
            assert!(
                p.len() <= 3 && (p.len() * longest <= 300 || p.len() == 1),
                "{p:?}"
            );
        }
        // With no pass cost to save, one row a pass pads nothing.
        let alone = by_length(&lengths, 16, None, None, Some(0));
        assert_eq!(padded(&alone), lengths.iter().sum::<usize>());
    }

    #[test]
    fn tokens_count_real_and_padded() {
        assert_eq!(tokens([3, 5, 2].into_iter(), None), (10, 15));
        assert_eq!(tokens([3, 5, 2].into_iter(), Some(8)), (10, 24));
        assert_eq!(tokens(std::iter::empty(), None), (0, 0));
    }
}
