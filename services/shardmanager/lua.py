"""The Redis Lua scripts of the shard manager: every state transition is one of these.

A script runs atomically in Redis, so each transition (grant, acknowledge,
renew, take back, roll over an epoch, snapshot, restore) is one indivisible
step whichever replica of the service runs it, and costs one round trip.
Time comes from Redis (`TIME`), never from a replica's clock, so replicas
agree on lease expiry. Scripts are replicated and written to the AOF as their
effects (Redis >= 7), so `TIME` inside them is safe.

Keys of one dataset (KEYS, in this order, see `KEY_NAMES`):
  meta      hash   settings, epoch, cursor into `order`, finished, seq, deleted
  order     string epoch's shard order, 4 bytes big-endian per shard
  requeue   list   shards taken back, handed out before the rest of `order`
  doing     hash   shard -> "deadline_ms|attempt|seq|holder"
  leases    zset   shard scored by lease deadline (ms), for expiry scans
  attempts  hash   shard -> deliveries in this epoch
  done      hash   shard -> holder that acknowledged it (this epoch)
  done_prev hash   the same for the previous epoch (late retried acks)
  stats     hash   "<epoch>:<counter>" -> count (samples or shards)
  failed    hash   "<epoch>:<shard>" -> 1 for shards past the retry limit
  lapsed    hash   shard -> "expired|holder" / "released|holder" (error messages)
  grants    hash   holder -> "epoch|shard|request_id" of its last grant
  ckpts     hash   checkpoint id -> JSON snapshot
  uncovered hash   "<epoch>:<shard>" -> holder of a provisional acknowledgement
  late      list   "<epoch>:<shard>" undone after their epoch rolled over, read again first
  steps     hash   "<epoch>:<shard>" -> the step that reads it (AcquireShard's read_step),
                   set or cleared at every grant, kept while DOING or uncovered
  fences    hash   holder -> the newest placement generation that released it
  releases  hash   holder -> "request_id|<reply>" of its last release with a request id

Provisional acknowledgements (a dataset created with `provisional_acks`): an
acknowledged shard is DONE, so an epoch rolls over as soon as it is read (a
synchronous job's ESTs never wait on each other's checkpoints), but it stays in
`uncovered` under its holder until CoverShards says a durable checkpoint holds
its step. Releasing the holder undoes its uncovered shards: those of the current
epoch go back to TODO like a taken-back DOING shard; those of an epoch already
rolled over go to `late` and are handed out, as shards of their own epoch,
before anything else; their grant is at once a provisional acknowledgement of
the new holder (the epoch is over: no lease). Both count as redeliveries.

A release may name the step its holder's reader resumes from (a durable checkpoint
holds every step before it): then the uncovered acknowledgements of reads before that
step become final, as CoverShards would make them, and only the later ones are undone.
So the order of a release and a cover of the same checkpoint does not matter, and a
release that overtakes the checkpoint writer's cover (its process died just after the
checkpoint was written) gives back no shard the checkpoint holds. `keep` releases
(the scheduler, when a process dies) take back DOING shards only.

Fences: the holders of a job's ESTs are shared by all its placements, so a placement
that should be gone (its worker declared lost) but still runs would read, acknowledge
and cover under the same holder as the placement that replaced it: its covers would make
final the reads the new one rolled back. Every holder call may carry the generation of
the caller's placement; a release with one raises the holder's stored generation to it
(a release of an older one is refused), and every call of an older generation than the
stored one is refused (FENCED) before it changes anything, in the same script, so no
stale call slips in between the check and the change. Generation 0 is unfenced (callers
that predate fences). The fences are not part of a snapshot and a restore leaves them
alone: generations count placements, which only go forward whatever data a restore
rewinds, so a restore never lets a stale placement back in.

TODO of the current epoch is `requeue` followed by `order[cursor:]`; a shard
delivered in this epoch and in none of requeue/doing/failed is DONE. The job
index (a set of dataset ids per job) is the one key a script names itself
(from a prefix in ARGV): the service runs on one Redis, not a Redis Cluster.

Every script replies with name/value pairs, `{'status', S, 'name', value, ...}`,
and each script's `*_REPLIES` below lists, per status, the names that status
carries: the store decodes replies by name against it (`store.decode_reply`),
so a field added, renamed or dropped on one side only fails loudly, naming the
script and the field, instead of shifting the fields after it.
"""

from __future__ import annotations

KEY_NAMES = (
    "meta",
    "order",
    "requeue",
    "doing",
    "leases",
    "attempts",
    "done",
    "done_prev",
    "stats",
    "failed",
    "lapsed",
    "grants",
    "ckpts",
    "uncovered",
    "late",
    "steps",
    "fences",
    "releases",
)

# Most expired leases one acquire takes back; the rest go on the next calls.
RECLAIM_BATCH = 64

# A script's replies: status -> the names of the fields that status carries.
Replies = dict[str, tuple[str, ...]]

# The refusals of every script that needs the dataset (in dynamic mode).
REFUSALS: Replies = {"NOTFOUND": (), "MODE": ("mode",)}
# The refusal of a holder call whose generation is older than the holder's (`current`).
FENCE_REFUSAL: Replies = {"FENCED": ("current",)}
# An acknowledgement's refusals (do_ack); `by` is the other holder, `why` the reason
# this holder lost the shard ('expired', 'released' or '').
ACK_REFUSALS: Replies = {
    "RANGE": ("num_shards",),
    "FUTURE": ("epoch",),
    "PAST": ("epoch",),
    "NOT_HELD": ("state", "by", "why"),
}

_PRELUDE = """
local K_META, K_ORDER, K_REQUEUE, K_DOING = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_LEASES, K_ATTEMPTS, K_DONE, K_DONE_PREV = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_STATS, K_FAILED, K_LAPSED = KEYS[9], KEYS[10], KEYS[11]
local K_GRANTS, K_CKPTS, K_UNCOVERED, K_LATE = KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local K_STEPS, K_FENCES, K_RELEASES = KEYS[16], KEYS[17], KEYS[18]

-- Integers leave Lua through string.format: tostring would print 1e+15.
local function I(x) return string.format('%d', x) end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local FIELDS = {'deleted', 'mode', 'size', 'shard_size', 'num_shards', 'num_epochs', 'lease_ms',
                'max_attempts', 'epoch', 'cursor', 'prev_epoch', 'seed', 'shuffle', 'provisional'}
local NUMERIC = {'size', 'shard_size', 'num_shards', 'num_epochs', 'lease_ms', 'max_attempts',
                 'epoch', 'cursor', 'prev_epoch'}

-- The dataset's settings and position; nil when it does not exist or was deleted.
local function load_meta()
  local v = redis.call('HMGET', K_META, unpack(FIELDS))
  if not v[1] or v[1] == '1' then return nil end
  local m = {}
  for i, f in ipairs(FIELDS) do m[f] = v[i] end
  for _, f in ipairs(NUMERIC) do m[f] = tonumber(m[f]) end
  return m
end

-- Record (or clear, '' = not known) the step that reads the shard `key` = "<epoch>:<shard>".
local function set_step(key, step)
  if step == '' then
    redis.call('HDEL', K_STEPS, key)
  else
    redis.call('HSET', K_STEPS, key, step)
  end
end

local function samples(m, s)
  if s == m.num_shards - 1 then return m.size - s * m.shard_size end
  return m.shard_size
end

local function parse_doing(rec)
  local deadline, attempt, seq, holder = string.match(rec, '^(%d+)|(%d+)|(%d+)|(.*)$')
  return tonumber(deadline), tonumber(attempt), tonumber(seq), holder
end

local function doing_record(deadline, attempt, seq, holder)
  return I(deadline) .. '|' .. I(attempt) .. '|' .. I(seq) .. '|' .. holder
end

local function bump(e, name, by)
  redis.call('HINCRBY', K_STATS, I(e) .. ':' .. name, I(by))
end

local function order_at(pos)
  local raw = redis.call('GETRANGE', K_ORDER, I(pos * 4), I(pos * 4 + 3))
  local b1, b2, b3, b4 = string.byte(raw, 1, 4)
  return I(((b1 * 256 + b2) * 256 + b3) * 256 + b4)
end

-- A DOING shard of `holder` goes back to TODO (behind earlier requeued shards,
-- ahead of every shard not handed out yet), or to FAILED past the retry limit.
local function take_back(m, s, holder, reason)
  redis.call('HDEL', K_DOING, s)
  redis.call('ZREM', K_LEASES, s)
  redis.call('HDEL', K_STEPS, I(m.epoch) .. ':' .. s)
  redis.call('HSET', K_LAPSED, s, reason .. '|' .. holder)
  local attempts = tonumber(redis.call('HGET', K_ATTEMPTS, s) or '0')
  if attempts >= m.max_attempts then
    redis.call('HSET', K_FAILED, I(m.epoch) .. ':' .. s, '1')
    bump(m.epoch, 'failed', samples(m, tonumber(s)))
    bump(m.epoch, 'shards_failed', 1)
    return false
  end
  redis.call('RPUSH', K_REQUEUE, s)
  return true
end

-- A provisional acknowledgement of a released holder is undone: the shard is not DONE any
-- more; it goes back to TODO (current epoch) or to `late` (an epoch already rolled over).
local function undo_ack(m, key, holder)
  local e, s = string.match(key, '^(%d+):(%d+)$')
  e = tonumber(e)
  redis.call('HDEL', K_UNCOVERED, key)
  redis.call('HDEL', K_STEPS, key)
  bump(e, 'done', -samples(m, tonumber(s)))
  bump(e, 'shards_done', -1)
  bump(e, 'shards_undone', 1)
  redis.call('HSET', K_META, 'finished', '0')
  if e == m.epoch then
    redis.call('HDEL', K_DONE, s)
    redis.call('HSET', K_LAPSED, s, 'released|' .. holder)
    redis.call('RPUSH', K_REQUEUE, s)
  else
    redis.call('RPUSH', K_LATE, key)
  end
  return s
end

-- The refusals every dynamic-mode script may reply with.
local NOTFOUND = {'status', 'NOTFOUND'}
local function wrong_mode(m) return {'status', 'MODE', 'mode', m.mode} end

-- A caller's generation from ARGV ('' or absent: 0, unfenced).
local function generation_arg(v) return tonumber(v ~= nil and v ~= '' and v or '0') end

-- The holder's generation (0: never fenced) and, when generation `g` (> 0) is older, the
-- refusal to reply with before anything changes.
local function fence(holder, g)
  local current = tonumber(redis.call('HGET', K_FENCES, holder) or '0')
  if g > 0 and g < current then return current, {'status', 'FENCED', 'current', I(current)} end
  return current, nil
end

-- DOING -> DONE for the holder: 'OK', 'DUP' (acknowledged by it before), or nil and the
-- refusal to reply with (RANGE, FUTURE, PAST or NOT_HELD; see ACK_REFUSALS).
local function do_ack(m, holder, e, s)
  local sn = tonumber(s)
  if sn >= m.num_shards then return nil, {'status', 'RANGE', 'num_shards', I(m.num_shards)} end
  if e ~= m.epoch then
    if e == m.prev_epoch and redis.call('HGET', K_DONE_PREV, s) == holder then return 'DUP' end
    if m.provisional == '1' and redis.call('HGET', K_UNCOVERED, I(e) .. ':' .. s) == holder then
      return 'DUP'
    end
    if e > m.epoch then return nil, {'status', 'FUTURE', 'epoch', I(m.epoch)} end
    return nil, {'status', 'PAST', 'epoch', I(m.epoch)}
  end
  local rec = redis.call('HGET', K_DOING, s)
  local other = ''
  if rec then
    local _, _, _, h = parse_doing(rec)
    if h == holder then
      redis.call('HDEL', K_DOING, s)
      redis.call('ZREM', K_LEASES, s)
      redis.call('HSET', K_DONE, s, holder)
      bump(e, 'done', samples(m, sn))
      bump(e, 'shards_done', 1)
      if m.provisional == '1' then redis.call('HSET', K_UNCOVERED, I(e) .. ':' .. s, holder) end
      return 'OK'
    end
    other = h
  end
  local done_by = redis.call('HGET', K_DONE, s)
  if done_by == holder then return 'DUP' end
  local state = 'todo'
  if rec then
    state = 'doing'
  elseif done_by then
    state, other = 'done', done_by
  elseif redis.call('HEXISTS', K_FAILED, I(e) .. ':' .. s) == 1 then
    state = 'failed'
  end
  local why = ''
  local lapsed = redis.call('HGET', K_LAPSED, s)
  if lapsed then
    local reason, h = string.match(lapsed, '^(%a+)|(.*)$')
    if h == holder then why = reason end
  end
  return nil, {'status', 'NOT_HELD', 'state', state, 'by', other, 'why', why}
end

-- The dataset's state as JSON: progress for Describe, a snapshot for Checkpoint.
local function state_json(full, checkpoint_id)
  local st = {
    version = 1,
    meta = redis.call('HGETALL', K_META),
    stats = redis.call('HGETALL', K_STATS),
    failed = redis.call('HKEYS', K_FAILED),
    doing = redis.call('HGETALL', K_DOING),
    requeue_len = redis.call('LLEN', K_REQUEUE),
    now_ms = I(now_ms()),
  }
  if full then
    st.requeue = redis.call('LRANGE', K_REQUEUE, 0, -1)
    st.attempts = redis.call('HGETALL', K_ATTEMPTS)
    st.checkpoint_id = checkpoint_id
  end
  return cjson.encode(st)
end
"""

ACQUIRE = (
    _PRELUDE
    + """
-- ARGV: holder, request_id, ack_epoch, ack_shard, next_order, next_order_epoch,
-- read_step ('' = not known), generation ('' or 0 = unfenced)
local holder, rid, read_step = ARGV[1], ARGV[2], ARGV[7] or ''

local m = load_meta()
if not m then return NOTFOUND end
if m.mode ~= 'dynamic' then return wrong_mode(m) end
local _, stale = fence(holder, generation_arg(ARGV[8]))
if stale then return stale end
local function granted(s, attempt, deadline, acked, e)
  return {'status', 'GRANTED', 'epoch', I(e or m.epoch), 'shard', s, 'attempt', I(attempt),
          'deadline_ms', I(deadline), 'acked', acked, 'lease_ms', I(m.lease_ms),
          'size', I(m.size), 'shard_size', I(m.shard_size), 'seed', m.seed, 'shuffle', m.shuffle}
end
local function pending(status, epoch, acked)
  return {'status', status, 'epoch', I(epoch), 'acked', acked}
end

-- 1. A repeated request gets back what the first one granted (its ack was applied then),
-- a DOING shard or a late one (4a).
if rid ~= '' then
  local g = redis.call('HGET', K_GRANTS, holder)
  if g then
    local ge, gs, grid = string.match(g, '^(%d+)|(%d+)|(.*)$')
    if grid == rid and tonumber(ge) == m.epoch then
      local rec = redis.call('HGET', K_DOING, gs)
      if rec then
        local deadline, attempt, _, h = parse_doing(rec)
        if h == holder then
          local acked = '-1'
          if ARGV[3] ~= '' then acked = '0' end
          return granted(gs, attempt, deadline, acked)
        end
      end
    end
    -- A late grant (4a) is no DOING shard: it is the holder's while it stays uncovered.
    if grid == rid and m.provisional == '1' and tonumber(ge) < m.epoch
        and redis.call('HGET', K_UNCOVERED, ge .. ':' .. gs) == holder then
      local acked = '-1'
      if ARGV[3] ~= '' then acked = '0' end
      return granted(gs, 2, now_ms() + m.lease_ms, acked, tonumber(ge))
    end
  end
end

-- 2. The previous shard's acknowledgement; refused means nothing changes.
local acked = '-1'
if ARGV[3] ~= '' then
  local done, refusal = do_ack(m, holder, tonumber(ARGV[3]), ARGV[4])
  if refusal then return refusal end
  if done == 'OK' then acked = '1' else acked = '0' end
end

-- 3. Expired leases go back to TODO (or FAILED).
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', I(now), 'LIMIT', 0, """
    + str(RECLAIM_BATCH)
    + """)
for _, s in ipairs(due) do
  local rec = redis.call('HGET', K_DOING, s)
  if rec then
    local _, _, _, h = parse_doing(rec)
    take_back(m, s, h, 'expired')
  else
    redis.call('ZREM', K_LEASES, s)
  end
end

-- 4a. Shards of a past epoch undone by a release: read again first, as shards of their
-- epoch, and provisionally acknowledged by this grant (their epoch has no DOING any more).
if m.provisional == '1' then
  local key = redis.call('LPOP', K_LATE)
  if key then
    local le, ls = string.match(key, '^(%d+):(%d+)$')
    local n = samples(m, tonumber(ls))
    redis.call('HSET', K_UNCOVERED, key, holder)
    set_step(key, read_step)
    bump(tonumber(le), 'done', n)
    bump(tonumber(le), 'shards_done', 1)
    bump(tonumber(le), 'redelivered', n)
    bump(tonumber(le), 'shards_redelivered', 1)
    if rid ~= '' then redis.call('HSET', K_GRANTS, holder, le .. '|' .. ls .. '|' .. rid) end
    return granted(ls, 2, now + m.lease_ms, acked, tonumber(le))
  end
end

-- 4. The next shard: requeued ones first, then the epoch order; at the end of
-- an epoch (TODO and DOING empty) the next epoch starts with its order, which
-- the caller computes (a pure function of seed and epoch) and passes in.
local s = redis.call('LPOP', K_REQUEUE)
if not s and m.cursor < m.num_shards then
  s = order_at(m.cursor)
  m.cursor = m.cursor + 1
  redis.call('HSET', K_META, 'cursor', I(m.cursor))
end
if not s then
  if redis.call('HLEN', K_DOING) > 0 then return pending('WAIT', m.epoch, acked) end
  if m.epoch + 1 >= m.num_epochs then
    redis.call('HSET', K_META, 'finished', '1')
    return pending('END', m.epoch, acked)
  end
  local e = m.epoch + 1
  if ARGV[6] ~= I(e) then
    return {'status', 'NEED_ORDER', 'epoch', I(e), 'acked', acked, 'num_shards', I(m.num_shards),
            'seed', m.seed}
  end
  if string.len(ARGV[5]) ~= 4 * m.num_shards then return redis.error_reply('bad order length') end
  redis.call('SET', K_ORDER, ARGV[5])
  if redis.call('EXISTS', K_DONE) == 1 then
    redis.call('RENAME', K_DONE, K_DONE_PREV)
  else
    redis.call('DEL', K_DONE_PREV)
  end
  redis.call('DEL', K_ATTEMPTS, K_LAPSED)
  m.prev_epoch, m.epoch, m.cursor = m.epoch, e, 1
  redis.call('HSET', K_META, 'epoch', I(e), 'cursor', '1', 'prev_epoch', I(m.prev_epoch))
  s = order_at(0)
end

-- 5. Grant: DOING with holder and lease deadline.
local attempt = redis.call('HINCRBY', K_ATTEMPTS, s, 1)
if attempt > 1 then
  bump(m.epoch, 'redelivered', samples(m, tonumber(s)))
  bump(m.epoch, 'shards_redelivered', 1)
end
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
local deadline = now + m.lease_ms
redis.call('HSET', K_DOING, s, doing_record(deadline, attempt, seq, holder))
redis.call('ZADD', K_LEASES, I(deadline), s)
set_step(I(m.epoch) .. ':' .. s, read_step)
if rid ~= '' then redis.call('HSET', K_GRANTS, holder, I(m.epoch) .. '|' .. s .. '|' .. rid) end
return granted(s, attempt, deadline, acked)
"""
)

ACQUIRE_REPLIES: Replies = {
    **REFUSALS,
    **FENCE_REFUSAL,
    **ACK_REFUSALS,
    "GRANTED": ("epoch", "shard", "attempt", "deadline_ms", "acked", "lease_ms", "size",
                "shard_size", "seed", "shuffle"),
    "WAIT": ("epoch", "acked"),
    "END": ("epoch", "acked"),
    "NEED_ORDER": ("epoch", "acked", "num_shards", "seed"),
}  # fmt: skip

ACK = (
    _PRELUDE
    + """
-- ARGV: holder, epoch, shard, generation ('' or 0 = unfenced)
local m = load_meta()
if not m then return NOTFOUND end
if m.mode ~= 'dynamic' then return wrong_mode(m) end
local _, stale = fence(ARGV[1], generation_arg(ARGV[4]))
if stale then return stale end
local done, refusal = do_ack(m, ARGV[1], tonumber(ARGV[2]), ARGV[3])
return refusal or {'status', done}
"""
)

ACK_REPLIES: Replies = {**REFUSALS, **FENCE_REFUSAL, **ACK_REFUSALS, "OK": (), "DUP": ()}

RENEW = (
    _PRELUDE
    + """
-- ARGV: holder, epoch, comma-separated shard ids ('' = every shard of the holder),
-- generation ('' or 0 = unfenced)
local holder = ARGV[1]
local m = load_meta()
if not m then return NOTFOUND end
if m.mode ~= 'dynamic' then return wrong_mode(m) end
local _, stale = fence(holder, generation_arg(ARGV[4]))
if stale then return stale end
local deadline = now_ms() + m.lease_ms
local renewed, lost = 0, {}
local function renew(s, rec)
  local _, attempt, seq, h = parse_doing(rec)
  redis.call('HSET', K_DOING, s, doing_record(deadline, attempt, seq, h))
  redis.call('ZADD', K_LEASES, I(deadline), s)
  renewed = renewed + 1
end
if ARGV[3] == '' then
  local all = redis.call('HGETALL', K_DOING)
  for i = 1, #all, 2 do
    local _, _, _, h = parse_doing(all[i + 1])
    if h == holder then renew(all[i], all[i + 1]) end
  end
else
  local same_epoch = tonumber(ARGV[2]) == m.epoch
  for s in string.gmatch(ARGV[3], '%d+') do
    local rec = nil
    if same_epoch then rec = redis.call('HGET', K_DOING, s) end
    local h = nil
    if rec then h = select(4, parse_doing(rec)) end
    if h == holder then renew(s, rec) else lost[#lost + 1] = s end
  end
end
return {'status', 'OK', 'renewed', I(renewed), 'deadline_ms', I(deadline),
        'lost', table.concat(lost, ',')}
"""
)

RENEW_REPLIES: Replies = {**REFUSALS, **FENCE_REFUSAL, "OK": ("renewed", "deadline_ms", "lost")}

RELEASE = (
    _PRELUDE
    + """
-- ARGV: holder, resume step ('' = none: undo every provisional ack), keep ('1': DOING only),
-- generation ('' or 0 = unfenced; otherwise it becomes the holder's, unless older),
-- request id ('' = none; the same id again replies what the first call did, changing
-- nothing: a retry after a lost answer learns what the release gave back)
local holder, resume, keep = ARGV[1], ARGV[2] or '', ARGV[3] == '1'
local rid = ARGV[5] or ''
local m = load_meta()
if not m then return NOTFOUND end
if m.mode ~= 'dynamic' then return wrong_mode(m) end
local g = generation_arg(ARGV[4])
local current, stale = fence(holder, g)
if stale then return stale end
if rid ~= '' then
  local memo = redis.call('HGET', K_RELEASES, holder)
  if memo then
    local mrid, e, rq, fl, cv, rl = string.match(memo, '^(.-)|(.-);(.-);(.-);(.-);(.*)$')
    if mrid == rid then
      return {'status', 'OK', 'epoch', e, 'requeued', rq, 'failed', fl, 'covered', cv,
              'released', rl, 'repeat', '1'}
    end
  end
end
if g > current then redis.call('HSET', K_FENCES, holder, I(g)) end
local function step_of(key) return redis.call('HGET', K_STEPS, key) or '-1' end
local all = redis.call('HGETALL', K_DOING)
local mine = {}
for i = 1, #all, 2 do
  local _, _, seq, h = parse_doing(all[i + 1])
  if h == holder then mine[#mine + 1] = {seq, all[i]} end
end
table.sort(mine, function(a, b) return a[1] < b[1] end)
-- released: "<epoch>:<shard>:<read step>:<1 if its ack was undone, 0 if it was DOING>"
local requeued, failed, released, covered = {}, {}, {}, 0
for _, x in ipairs(mine) do
  local key = I(m.epoch) .. ':' .. x[2]
  local step = step_of(key)
  if take_back(m, x[2], holder, 'released') then
    requeued[#requeued + 1] = x[2]
    released[#released + 1] = key .. ':' .. step .. ':0'
  else
    failed[#failed + 1] = x[2]
  end
end
if m.provisional == '1' and not keep then
  local uncovered = redis.call('HGETALL', K_UNCOVERED)
  local undo = {}
  for i = 1, #uncovered, 2 do
    if uncovered[i + 1] == holder then
      local key = uncovered[i]
      local step = tonumber(step_of(key))
      if resume ~= '' and step >= 0 and step < tonumber(resume) then
        -- A durable checkpoint holds the step that read it: final, as CoverShards would.
        redis.call('HDEL', K_UNCOVERED, key)
        redis.call('HDEL', K_STEPS, key)
        covered = covered + 1
      else
        undo[#undo + 1] = {step, key}
      end
    end
  end
  -- Handed out again in the order they were read.
  table.sort(undo, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  for _, x in ipairs(undo) do
    requeued[#requeued + 1] = undo_ack(m, x[2], holder)
    released[#released + 1] = x[2] .. ':' .. I(x[1]) .. ':1'
  end
end
redis.call('HDEL', K_GRANTS, holder)
local reply = {I(m.epoch), table.concat(requeued, ','), table.concat(failed, ','), I(covered),
               table.concat(released, ',')}
if rid ~= '' then
  redis.call('HSET', K_RELEASES, holder, rid .. '|' .. table.concat(reply, ';'))
end
return {'status', 'OK', 'epoch', reply[1], 'requeued', reply[2], 'failed', reply[3],
        'covered', reply[4], 'released', reply[5], 'repeat', '0'}
"""
)

RELEASE_REPLIES: Replies = {
    **REFUSALS,
    **FENCE_REFUSAL,
    "OK": ("epoch", "requeued", "failed", "covered", "released", "repeat"),
}

COVER = (
    _PRELUDE
    + """
-- ARGV: holder, comma-separated '<epoch>:<shard>' keys a durable checkpoint now holds,
-- generation ('' or 0 = unfenced)
local holder = ARGV[1]
local m = load_meta()
if not m then return NOTFOUND end
if m.mode ~= 'dynamic' then return wrong_mode(m) end
local _, stale = fence(holder, generation_arg(ARGV[3]))
if stale then return stale end
local covered = 0
for key in string.gmatch(ARGV[2], '[^,]+') do
  if redis.call('HGET', K_UNCOVERED, key) == holder then
    redis.call('HDEL', K_UNCOVERED, key)
    redis.call('HDEL', K_STEPS, key)
    covered = covered + 1
  end
end
return {'status', 'OK', 'covered', I(covered), 'uncovered', I(redis.call('HLEN', K_UNCOVERED))}
"""
)

COVER_REPLIES: Replies = {**REFUSALS, **FENCE_REFUSAL, "OK": ("covered", "uncovered")}

CREATE = (
    _PRELUDE
    + """
-- ARGV: dataset_id, job index key prefix, order ('' in deterministic mode), then
-- setting name/value pairs (stored form). A setting added after a dataset was stored
-- compares as its default (ADDED): re-creating a dataset that a shard manager of the
-- previous version stored is not a conflict.
local ADDED = {provisional = '0'}
local deleted = redis.call('HGET', K_META, 'deleted')
if deleted == '0' then
  for i = 4, #ARGV, 2 do
    local current = redis.call('HGET', K_META, ARGV[i]) or ADDED[ARGV[i]]
    if current ~= ARGV[i + 1] then
      return {'status', 'CONFLICT', 'field', ARGV[i], 'current', current or '',
              'wanted', ARGV[i + 1]}
    end
  end
  return {'status', 'EXISTS', 'state', state_json(false, '')}
end
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
local job_id = ''
for i = 4, #ARGV, 2 do
  redis.call('HSET', K_META, ARGV[i], ARGV[i + 1])
  if ARGV[i] == 'job_id' then job_id = ARGV[i + 1] end
end
redis.call('HSET', K_META, 'epoch', '0', 'cursor', '0', 'finished', '0', 'seq', '0',
           'prev_epoch', '-1', 'deleted', '0', 'created_ms', I(now_ms()))
if ARGV[3] ~= '' then redis.call('SET', K_ORDER, ARGV[3]) end
redis.call('SADD', ARGV[2] .. job_id, ARGV[1])
return {'status', 'CREATED', 'state', state_json(false, '')}
"""
)

CREATE_REPLIES: Replies = {
    "CONFLICT": ("field", "current", "wanted"),
    "EXISTS": ("state",),
    "CREATED": ("state",),
}

DELETE = (
    _PRELUDE
    + """
-- ARGV: dataset_id, job index key prefix, grace seconds (0: remove at once)
local v = redis.call('HMGET', K_META, 'deleted', 'job_id')
if not v[1] or v[1] == '1' then return {'status', 'ABSENT'} end
redis.call('HSET', K_META, 'deleted', '1')
redis.call('SREM', ARGV[2] .. v[2], ARGV[1])
local ttl = tonumber(ARGV[3])
for i = 1, #KEYS do
  if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) else redis.call('UNLINK', KEYS[i]) end
end
return {'status', 'DELETED'}
"""
)

DELETE_REPLIES: Replies = {"DELETED": (), "ABSENT": ()}

STATE = (
    _PRELUDE
    + """
-- ARGV: 'describe' | 'checkpoint', checkpoint id
-- Returns the dataset's state as JSON; 'checkpoint' also stores it under the id.
local m = load_meta()
if not m then return NOTFOUND end
local full = ARGV[1] == 'checkpoint'
if full and m.mode ~= 'dynamic' then return wrong_mode(m) end
local js = state_json(full, ARGV[2])
if full then redis.call('HSET', K_CKPTS, ARGV[2], js) end
return {'status', 'OK', 'state', js}
"""
)

STATE_REPLIES: Replies = {**REFUSALS, "OK": ("state",)}

RESTORE = (
    _PRELUDE
    + """
-- ARGV: checkpoint id, force ('1'/'0'), order of the snapshot's epoch, that epoch ('' unknown)
local m = load_meta()
if not m then return NOTFOUND end
if m.mode ~= 'dynamic' then return wrong_mode(m) end
local js = redis.call('HGET', K_CKPTS, ARGV[1])
if not js then return {'status', 'NO_CHECKPOINT'} end
local held = redis.call('HLEN', K_DOING)
if held > 0 and ARGV[2] ~= '1' then return {'status', 'LIVE', 'held', I(held)} end
local st = cjson.decode(js)
local sm = {}
for i = 1, #st.meta, 2 do sm[st.meta[i]] = st.meta[i + 1] end
if sm.epoch ~= I(m.epoch) then
  if ARGV[4] ~= sm.epoch then
    return {'status', 'NEED_ORDER', 'epoch', sm.epoch, 'num_shards', I(m.num_shards),
            'seed', m.seed}
  end
  if string.len(ARGV[3]) ~= 4 * m.num_shards then return redis.error_reply('bad order length') end
  redis.call('SET', K_ORDER, ARGV[3])
end
-- K_FENCES stays: placements only go forward, whatever progress the snapshot rewinds to.
redis.call('DEL', K_REQUEUE, K_DOING, K_LEASES, K_ATTEMPTS, K_DONE, K_DONE_PREV, K_STATS,
           K_FAILED, K_LAPSED, K_GRANTS, K_UNCOVERED, K_LATE, K_STEPS, K_RELEASES)
-- DOING shards go back to TODO first, in the order they were handed out.
local doing = {}
for i = 1, #st.doing, 2 do
  local _, _, seq = parse_doing(st.doing[i + 1])
  doing[#doing + 1] = {seq, st.doing[i]}
end
table.sort(doing, function(a, b) return a[1] < b[1] end)
for _, d in ipairs(doing) do redis.call('RPUSH', K_REQUEUE, d[2]) end
for _, s in ipairs(st.requeue) do redis.call('RPUSH', K_REQUEUE, s) end
for i = 1, #st.attempts, 2 do redis.call('HSET', K_ATTEMPTS, st.attempts[i], st.attempts[i + 1]) end
for i = 1, #st.stats, 2 do redis.call('HSET', K_STATS, st.stats[i], st.stats[i + 1]) end
for _, f in ipairs(st.failed) do redis.call('HSET', K_FAILED, f, '1') end
local finished = sm.finished
if #doing > 0 then finished = '0' end
redis.call('HSET', K_META, 'epoch', sm.epoch, 'cursor', sm.cursor, 'finished', finished,
           'seq', sm.seq, 'prev_epoch', '-1')
return {'status', 'RESTORED', 'state', state_json(false, '')}
"""
)

RESTORE_REPLIES: Replies = {
    **REFUSALS,
    "NO_CHECKPOINT": (),
    "LIVE": ("held",),
    "NEED_ORDER": ("epoch", "num_shards", "seed"),
    "RESTORED": ("state",),
}
