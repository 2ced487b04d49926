-- turnstile: sliding window counter (id 6), its arithmetic written once. Windows as in
-- fixed window; with n the current window's count, m the previous one's and e = now - w * P,
-- the estimate is est = m * (P - e) / P + n. Admit iff est + c <= L: deny at once when
-- n + c > L, else compare m * (P - e) <= (L - n - c) * P, so nothing exceeds L * P.
-- Composed at the top level (after prelude.lua, before fast.lua), so every path reaches it:
-- the fast path (fast.lua calls sliding_decide on the numbers it matched) and the general
-- path (methods.lua's methods, refunds and states.lua's carry-over start from it).
--
-- State at KEY: "alg.L.P.B|updated_ms|n|m", n counted in updated_ms's window
-- w = floor(updated_ms / P), m in the one before; neither ever more than L.

-- The decision of sliding window p (p.L, p.P) at now for cost c on the state (updated, cur,
-- prev) (updated <= now; the counts numbers, or their digits as stored), written at
-- out[o + 1 ..]: retry as whole, num, den (whole + num / den ms; -1, 0, 1: never),
-- remaining, and reset in whole ms. Returns whether it admits, reset_after in ms, and the
-- counts after (current, previous): the ones to store when it admits c > 0, else the counts
-- seen from now's window (a query's: what a refund and a carry-over start from). Returns
-- nil when the state is none a request leaves (a count above L).
local function sliding_decide(p, updated, cur, prev, now, c, out, o)
  local L, P = p.L, p.P
  cur, prev = cur + 0, prev + 0
  if cur > L or prev > L then return nil end
  local e = now % P
  local w = (now - e) / P
  local r = updated % P
  local v = (updated - r) / P
  -- The counts seen from w: updated's window is w, the one before, or older.
  local n, m = 0, 0
  if v == w then n, m = cur, prev elseif v + 1 == w then m = cur end
  local weighted = m * (P - e)
  local rw, rn, rd, k = -1, 0, 1, n
  if c == 0 then
    rw = 0
  elseif c <= L then
    if n + c > L then
      -- wait for the next window (m' = n, n' = 0): (P - e) + P * (n + c - L) / n
      local num = P * (n + c - L)
      rn, rd = num % n, n
      rw = (num - rn) / n + (P - e)
    elseif weighted <= (L - n - c) * P then
      rw, k = 0, n + c
    else
      -- the previous window's weight must decay: (m * (P - e) - (L - n - c) * P) / m
      local num = weighted - (L - n - c) * P
      rn, rd = num % m, m
      rw = (num - rn) / m
    end
  end
  -- remaining: floor(L - est) with k counted in the current window, at least 0
  local rem, free = 0, (L - k) * P - weighted
  if free > 0 then
    r = free % P
    rem = (free - r) / P
  end
  local reset = 0
  if k > 0 then reset = 2 * P - e elseif m > 0 then reset = P - e end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = rw, rn, rd, rem, reset
  return rw == 0 and rn == 0, reset, k, m
end
