-- turnstile: sliding log (id 5). A log of admitted (time, cost), one entry per distinct
-- millisecond; an entry logged at s expires at exactly s + P. used = the live entries' cost.
-- Admit iff used + c <= L (log_admits below, which every path calls); a denial's retry is
-- when enough of the oldest live entries have expired, a query's reset when the newest has
-- (log_list.lua, the general path: only it reads more of the log than its ends).
--
-- State at KEY: "alg.L.P.B|updated_ms|total", total = the cost of every entry in the list
-- (expired ones not yet pruned included); the log at LOGKEY (KEY's hash tag, '~log:', the
-- state format and the policy name): a list of "time:cost", oldest first.
--
-- s + P can pass 2^53 when s is near it: an entry is live iff now - s < P, and it expires
-- P - (now - s) ms from now (s <= updated_ms <= now).
--
-- Composed at the top level (after prelude.lua, before fast.lua), so every path reaches it.

-- Whether sliding log p (p.L, p.P) with used units live admits cost c: 1 <= c and used + c
-- <= L (compared without forming the sum). If so, its reply at out[o + 1 ..]: retry 0,
-- remaining, and reset P, in whole ms (the new entry, at now, is the newest); its
-- reset_after is then P.
local function log_admits(p, used, c, out, o)
  local L = p.L
  if c < 1 or c > L or used > L - c then return false end
  out[o + 1], out[o + 2], out[o + 3] = 0, L - used - c, p.P
  return true
end
