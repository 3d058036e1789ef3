import Foundation
import Testing
import TestSupport

@testable import DocumentEngine

/// RetentionPolicy: which versions garbage collection keeps, and its text form.
@Suite struct RetentionPolicyTests {
    typealias History = [(id: VersionID, created: Timestamp)]

    // Nanoseconds.
    static let second: Int64 = 1_000_000_000
    static let minute = 60 * second
    static let hour = 60 * minute
    static let day = 24 * hour
    static let week = 7 * day

    /// A Thursday 00:00 UTC (a week boundary since 1970) in 2025.
    static let weekStart = 2900 * week

    static func ids(_ raw: Int64...) -> Set<VersionID> { Set(raw.map(VersionID.init(rawValue:))) }
    static func ids(_ raw: some Sequence<Int64>) -> Set<VersionID> { Set(raw.map(VersionID.init(rawValue:))) }

    static func history(_ versions: [(id: Int64, created: Int64)]) -> History {
        versions.map { (VersionID(rawValue: $0.id), Timestamp(rawValue: $0.created)) }
    }

    /// A small seeded generator, so that a failure can be replayed.
    typealias Generator = SplitMix64

    // MARK: Keep-last and keep-all

    @Test func keepLastKeepsTheNewestIdsWhateverTheirTimes() {
        var random = Generator(seed: 1)
        let now = Self.weekStart
        // Times run backwards against ids (a clock step): ids still decide.
        var versions = Self.history(
            (1...10).map { (Int64($0), now - 365 * Self.day - Int64($0) * Self.hour) })
        versions.shuffle(using: &random)
        let policy = RetentionPolicy(keepLast: 3, keepAll: .zero, tiers: [])
        #expect(policy.versionsToKeep(versions, now: Timestamp(rawValue: now)) == Self.ids(8, 9, 10))
        let all = RetentionPolicy(keepLast: 50, keepAll: .zero, tiers: [])
        #expect(all.versionsToKeep(versions, now: Timestamp(rawValue: now)) == Self.ids(1...10))
        // Zero is raised to 1, the current version.
        let zero = RetentionPolicy(keepLast: 0, keepAll: .zero, tiers: [])
        #expect(zero.keepLast == 1)
        #expect(zero.versionsToKeep(versions, now: Timestamp(rawValue: now)) == Self.ids(10))
        #expect(policy.versionsToKeep([], now: Timestamp(rawValue: now)).isEmpty)
    }

    @Test func keepAllKeepsEveryVersionUpToItsAgeInclusive() {
        let now = Self.weekStart + 17 * Self.minute
        // Ages 0, 10, ..., 120 minutes; id 13 is the newest.
        let versions = Self.history((0...12).map { (Int64(13 - $0), now - Int64($0) * 10 * Self.minute) })
        let policy = RetentionPolicy(keepLast: 1, keepAll: .seconds(3600), tiers: [])
        // Ages 0...60 minutes: the one exactly an hour old too.
        #expect(policy.versionsToKeep(versions, now: Timestamp(rawValue: now)) == Self.ids(7...13))

        let fine = RetentionPolicy(keepLast: 1, keepAll: .milliseconds(1500), tiers: [])
        let edge = Self.history([
            (1, now - 1_500_000_001), (2, now - 1_500_000_000), (3, now - 1_499_999_999), (4, now - Self.day),
        ])
        #expect(fine.versionsToKeep(edge, now: Timestamp(rawValue: now)) == Self.ids(2, 3, 4))
    }

    // MARK: Buckets

    @Test func bucketsAreAlignedToUTCHoursAndWeeksSince1970() {
        let policy = RetentionPolicy(keepLast: 1, keepAll: .zero, tiers: [.hourly(for: nil)])
        let h = Self.weekStart - 10 * Self.hour  // an hour boundary
        let now = Timestamp(rawValue: h + 5 * Self.hour + 7 * Self.minute)
        let versions = Self.history([
            (1, h + 5 * Self.minute), (2, h + 55 * Self.minute),  // one hour: only 2
            (3, h + 65 * Self.minute), (4, h + 115 * Self.minute),  // the next: only 4
            (5, h + 3 * Self.hour),
        ])
        #expect(policy.versionsToKeep(versions, now: now) == Self.ids(2, 4, 5))

        // Weeks start on Thursday 00:00 UTC, as 1970-01-01 did.
        let weekly = RetentionPolicy(keepLast: 1, keepAll: .zero, tiers: [.weekly(for: nil)])
        let w = Self.weekStart
        let later = Timestamp(rawValue: w + 30 * Self.day)
        let across = Self.history([(1, w - Self.minute), (2, w + Self.minute), (3, w + 30 * Self.day)])
        #expect(weekly.versionsToKeep(across, now: later) == Self.ids(1, 2, 3))
        let within = Self.history([
            (1, w + Self.minute), (2, w + 7 * Self.day - Self.minute), (3, w + 30 * Self.day),
        ])
        #expect(weekly.versionsToKeep(within, now: later) == Self.ids(2, 3))
    }

    @Test func aTierEndsAtItsSpanInclusiveAndLaterTiersNeedAnEnd() {
        let policy = RetentionPolicy(
            keepLast: 1, keepAll: .seconds(3600), tiers: [.hourly(for: .seconds(3600))])
        let now = Self.weekStart + 30 * Self.minute
        // 2 hours old: the tier's last instant; a nanosecond more: past every tier.
        let at = Self.history([(1, now - 2 * Self.hour), (9, now)])
        #expect(policy.versionsToKeep(at, now: Timestamp(rawValue: now)) == Self.ids(1, 9))
        let past = Self.history([(1, now - 2 * Self.hour - 1), (9, now)])
        #expect(policy.versionsToKeep(past, now: Timestamp(rawValue: now)) == Self.ids(9))

        // A tier after one that lasts forever never applies.
        let forever = RetentionPolicy(keepLast: 1, keepAll: .zero, tiers: [.weekly(for: nil)])
        let shadowed = RetentionPolicy(
            keepLast: 1, keepAll: .zero, tiers: [.weekly(for: nil), .hourly(for: nil)])
        let versions = Self.history((1...100).map { (Int64($0), now - Int64(100 - $0) * 7 * Self.hour) })
        #expect(
            shadowed.versionsToKeep(versions, now: Timestamp(rawValue: now))
                == forever.versionsToKeep(versions, now: Timestamp(rawValue: now)))
    }

    /// One version every 5 minutes for 60 days, under the standard policy, `now` at midnight on a
    /// Sunday (UTC) so that the kept versions can be counted by hand.
    @Test func standardPolicyOnSixtyDaysOfFiveMinuteSaves() {
        let now = Self.weekStart + 3 * Self.day
        let count = 60 * 288
        // Version k (k = 0 is the newest) is k * 5 minutes old; ids grow with time.
        let age = { (k: Int) in Int64(k) * 5 * Self.minute }
        let id = { (k: Int) in Int64(count - k) }
        var random = Generator(seed: 2)
        let versions = Self.history((0..<count).map { (id($0), now - age($0)) }).shuffled(using: &random)
        let kept = RetentionPolicy.standard.versionsToKeep(versions, now: Timestamp(rawValue: now))

        // Ages 0...60 minutes, the hour kept whole: k = 0...12.
        let all = (0...12).map(id)
        // Hour h back (ages (h, h+1] hours) keeps its newest, h hours 5 minutes old; hours 1...24
        // lie in the hourly tier (ages (1 h, 25 h]).
        let hourly = (1...24).map { id(12 * $0 + 1) }
        // Day d back keeps its newest, d days 5 minutes old. Day 1's is hour 24's, kept by the
        // hourly tier; days 2...31 lie in the daily tier (ages (25 h, 31 d 1 h]).
        let daily = (2...31).map { id(288 * $0 + 1) }
        // Weeks run Thursday to Wednesday, so week n back holds ages (3 + 7(n-1), 3 + 7n] days.
        // Week 5's newest (31 d 5 min) is day 31's, in the daily tier; weeks 6...9 keep theirs.
        let weekly = (6...9).map { id(288 * (3 + 7 * ($0 - 1)) + 1) }
        #expect(kept == Self.ids(all + hourly + daily + weekly))
        #expect(kept.count == 13 + 24 + 30 + 4)

        // The same, counted per tier by age.
        let ages = versions.filter { kept.contains($0.id) }.map { now - $0.created.rawValue }
        #expect(ages.filter { $0 <= Self.hour }.count == 13)
        #expect(ages.filter { $0 > Self.hour && $0 <= 25 * Self.hour }.count == 24)
        #expect(ages.filter { $0 > 25 * Self.hour && $0 <= 31 * Self.day + Self.hour }.count == 30)
        #expect(ages.filter { $0 > 31 * Self.day + Self.hour }.count == 4)
        Self.expectNewestPerBucket(kept, of: versions, now: now)
    }

    /// Under the standard policy with nested intervals, each version kept beyond `keepAll` (and not
    /// among the newest 10) is the
    /// newest of its bucket at its tier's interval, and each bucket wholly inside a tier keeps its
    /// newest version.
    static func expectNewestPerBucket(
        _ kept: Set<VersionID>, of versions: History, now: Int64,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let tiers: [(interval: Int64, start: Int64, end: Int64)] = [
            (hour, hour, 25 * hour), (day, 25 * hour, 31 * day + hour), (week, 31 * day + hour, .max),
        ]
        func bucket(_ time: Int64, _ interval: Int64) -> Int64 {
            time >= 0 ? time / interval : (time + 1) / interval - 1
        }
        for tier in tiers {
            var newest: [Int64: VersionID] = [:]
            var oldestAge: [Int64: Int64] = [:]
            var youngestAge: [Int64: Int64] = [:]
            for v in versions {
                let time = min(v.created.rawValue, now)
                let b = bucket(time, tier.interval)
                newest[b] = max(newest[b] ?? v.id, v.id)
                oldestAge[b] = max(oldestAge[b] ?? 0, now - time)
                youngestAge[b] = min(youngestAge[b] ?? .max, now - time)
            }
            // The newest 10 are kept whatever their buckets.
            let newestTen = Set(versions.map(\.id).sorted(by: >).prefix(10))
            for v in versions where kept.contains(v.id) && !newestTen.contains(v.id) {
                let age = now - min(v.created.rawValue, now)
                guard age > tier.start, age <= tier.end else { continue }
                #expect(
                    newest[bucket(min(v.created.rawValue, now), tier.interval)] == v.id,
                    "\(v.id) is kept at age \(age) but is not the newest of its bucket",
                    sourceLocation: sourceLocation)
            }
            for (b, id) in newest {
                guard let oldest = oldestAge[b], let youngest = youngestAge[b],
                    youngest > tier.start, oldest <= tier.end
                else { continue }
                #expect(
                    kept.contains(id), "bucket \(b) lost its newest, \(id)", sourceLocation: sourceLocation)
            }
        }
    }

    @Test func randomHistoriesKeepTheNewestOfEachBucket() {
        var random = Generator(seed: 3)
        for _ in 0..<20 {
            let now = Self.weekStart + Int64.random(in: 0..<Self.week, using: &random)
            var time = now - 70 * Self.day
            var versions: [(Int64, Int64)] = []
            // Bursts and quiet spells.
            while time < now {
                versions.append((Int64(versions.count + 1), time))
                time +=
                    Bool.random(using: &random)
                    ? Int64.random(in: 1...(10 * Self.minute), using: &random)
                    : Int64.random(in: 1...(2 * Self.day), using: &random)
            }
            let history = Self.history(versions).shuffled(using: &random)
            let kept = RetentionPolicy.standard.versionsToKeep(history, now: Timestamp(rawValue: now))
            Self.expectNewestPerBucket(kept, of: history, now: now)
            #expect(kept.contains(VersionID(rawValue: Int64(versions.count))))
        }
    }

    /// With intervals that do not nest, a coarse bucket's newest version is kept while it crosses
    /// a finer tier, where it is not its bucket's newest; else the coarse bucket would lose it.
    @Test func aCoarseBucketsVersionSurvivesAFinerTier() throws {
        let o = Self.weekStart  // a multiple of 6 hours
        let policy = try RetentionPolicy(parsing: "last=1,all=0,every=2h:for=10h,every=3h:for=forever")
        let versions = Self.history([
            (1, o + 150 * Self.minute),  // newest of 3h bucket [0, 3), not of 2h bucket [2, 4)
            (2, o + 210 * Self.minute),  // newest of 2h bucket [2, 4)
            (3, o + 4 * Self.hour),
        ])
        #expect(
            policy.versionsToKeep(versions, now: Timestamp(rawValue: o + 4 * Self.hour)) == Self.ids(1, 2, 3))
    }

    // MARK: Stability

    /// Which tier of the standard policy holds `age`: -1 for the keep-all hour, nil past none.
    static func standardTier(_ age: Int64) -> Int {
        if age <= hour { return -1 }
        if age <= 25 * hour { return 0 }
        if age <= 31 * day + hour { return 1 }
        return 2
    }

    /// Collect daily for 40 days, saving every few minutes in between: a version kept for a
    /// bucket stays kept while it stays in that tier; it may go only when it moves to a coarser
    /// tier. Collecting twice at once changes nothing.
    @Test func keptVersionsStayKeptUntilTheirTierEnds() {
        var random = Generator(seed: 4)
        let policy = RetentionPolicy.standard
        var now = Self.weekStart + 13 * Self.hour + 11 * Self.minute
        var nextID: Int64 = 1
        var times: [VersionID: Int64] = [:]
        func save(until end: Int64, from start: Int64) {
            var time = start
            while time < end {
                times[VersionID(rawValue: nextID)] = time
                nextID += 1
                time += Int64.random(in: 1...(9 * Self.minute), using: &random)
            }
        }
        save(until: now, from: now - 60 * Self.day)
        var previous: (kept: Set<VersionID>, now: Int64)?
        var movedAndDropped = 0
        for _ in 0..<40 {
            let history = times.map { (id: $0.key, created: Timestamp(rawValue: $0.value)) }
            let kept = policy.versionsToKeep(history, now: Timestamp(rawValue: now))
            let survivors = history.filter { kept.contains($0.id) }
            #expect(policy.versionsToKeep(survivors, now: Timestamp(rawValue: now)) == kept)
            if let previous {
                let newestLast = Set(previous.kept.sorted(by: >).prefix(policy.keepLast))
                for id in previous.kept where !newestLast.contains(id) {
                    guard let time = times[id] else { continue }
                    let before = Self.standardTier(previous.now - time)
                    let after = Self.standardTier(now - time)
                    guard before >= 0 else { continue }  // kept by keep-all, not for a bucket
                    if before == after {
                        #expect(kept.contains(id), "\(id) was kept in tier \(before) and is still there")
                    } else if !kept.contains(id) {
                        movedAndDropped += 1
                    }
                }
            }
            previous = (kept, now)
            times = times.filter { kept.contains($0.key) }
            let next = now + Self.day + Int64.random(in: -Self.hour...Self.hour, using: &random)
            save(until: next, from: now + Self.minute)
            now = next
        }
        // The test saw versions move to a coarser tier and go.
        #expect(movedAndDropped > 40)
    }

    // MARK: Compatibility

    /// Today's rule, as SQLiteStore.pruneVersions and collectGarbage apply it.
    static func oldRule(_ versions: History, keepLast: Int, keepFor: Duration, now: Timestamp) -> Set<
        VersionID
    > {
        let keepLast = max(1, keepLast)
        let mainline = versions.sorted { $0.id > $1.id }
        guard mainline.count > keepLast else { return Set(mainline.map(\.id)) }
        let keep = keepFor.components
        let horizon = now.rawValue - keep.seconds * 1_000_000_000 - keep.attoseconds / 1_000_000_000
        return Set(
            mainline.prefix(keepLast).map(\.id)
                + mainline.dropFirst(keepLast).filter { $0.created.rawValue >= horizon }.map(\.id))
    }

    static func oldDocumentExpired(deletedAt: Timestamp, keepFor: Duration, now: Timestamp) -> Bool {
        let keep = keepFor.components
        return deletedAt.rawValue < now.rawValue - keep.seconds * 1_000_000_000 - keep.attoseconds
            / 1_000_000_000
    }

    @Test func compatibilityInitMatchesTodaysRule() {
        var random = Generator(seed: 5)
        let now = Timestamp(rawValue: Self.weekStart + 5 * Self.hour + 123_456_789)
        var compared = 0
        for _ in 0..<2000 {
            let keepFor: Duration =
                [
                    .zero, .nanoseconds(1), .milliseconds(1500), .seconds(3600), .seconds(30 * 86400),
                    .nanoseconds(Int64.random(in: 0...(60 * Self.day), using: &random)),
                ].randomElement(using: &random) ?? .zero
            let keepLast = Int.random(in: -2...12, using: &random)
            let horizon = RetentionPolicy.nanoseconds(keepFor)
            var ids = Set<Int64>()
            var versions: [(Int64, Int64)] = []
            for _ in 0..<Int.random(in: 0...25, using: &random) {
                let id = Int64.random(in: 1...1000, using: &random)
                guard ids.insert(id).inserted else { continue }
                var created: Int64 =
                    [
                        now.rawValue - horizon, now.rawValue - horizon - 1, now.rawValue - horizon + 1,
                        now.rawValue + Int64.random(in: (-60 * Self.day)...Self.day, using: &random),
                    ].randomElement(using: &random) ?? 0
                // A zero keepFor no longer keeps versions stamped at or after now (tested below).
                if horizon == 0 { created = min(created, now.rawValue - 1) }
                versions.append((id, created))
            }
            let history = Self.history(versions)
            let policy = RetentionPolicy(keepLast: keepLast, keepFor: keepFor)
            #expect(
                policy.versionsToKeep(history, now: now)
                    == Self.oldRule(history, keepLast: keepLast, keepFor: keepFor, now: now),
                "keepLast \(keepLast), keepFor \(keepFor), \(versions)")
            let deletedAt = Timestamp(
                rawValue: [
                    now.rawValue - horizon, now.rawValue - horizon - 1, now.rawValue, now.rawValue + 1,
                ]
                .randomElement(using: &random) ?? 0)
            #expect(
                policy.isExpired(deletedAt: deletedAt, now: now)
                    == Self.oldDocumentExpired(deletedAt: deletedAt, keepFor: keepFor, now: now))
            compared += 1
        }
        #expect(compared == 2000)
        #expect(RetentionPolicy() == RetentionPolicy(keepLast: 50, keepFor: .seconds(30 * 86400)))
        #expect(RetentionPolicy().keepLast == 50)
        #expect(RetentionPolicy(keepLast: 3, keepFor: .seconds(60)).keepAll == .seconds(60))
        #expect(
            RetentionPolicy(keepLast: 3, keepFor: .seconds(60)).deletedDocumentsExpireAfter == .seconds(60))
        #expect(RetentionPolicy(keepLast: 3, keepFor: .seconds(60)).tiers.isEmpty)
    }

    /// The one deliberate difference: with keepFor zero, today's rule kept versions stamped at or
    /// after `now` (after a clock step); now only keepLast keeps them.
    @Test func zeroKeepForNoLongerKeepsVersionsStampedAtNow() {
        let now = Timestamp(rawValue: Self.weekStart)
        let versions = Self.history([
            (1, now.rawValue), (2, now.rawValue + Self.hour), (3, now.rawValue - Self.hour),
        ])
        #expect(Self.oldRule(versions, keepLast: 1, keepFor: .zero, now: now) == Self.ids(1, 2, 3))
        #expect(
            RetentionPolicy(keepLast: 1, keepFor: .zero).versionsToKeep(versions, now: now) == Self.ids(3))
    }

    @Test func currentOnlyKeepsOnlyTheNewest() {
        var random = Generator(seed: 6)
        let now = Timestamp(rawValue: Self.weekStart)
        #expect(RetentionPolicy.currentOnly == RetentionPolicy(keepLast: 1, keepFor: .zero))
        for _ in 0..<200 {
            let count = Int.random(in: 1...30, using: &random)
            var versions: [(id: Int64, created: Int64)] = []
            for n in 1...count {
                // Now, a day ahead (a clock step), a day back, or anywhere in two weeks.
                let offsets: [Int64] = [
                    0, Self.day, -Self.day, Int64.random(in: -Self.week...Self.week, using: &random),
                ]
                versions.append((Int64(n * 3), now.rawValue + (offsets.randomElement(using: &random) ?? 0)))
            }
            versions.shuffle(using: &random)
            #expect(
                RetentionPolicy.currentOnly.versionsToKeep(Self.history(versions), now: now)
                    == Self.ids(Int64(count * 3)))
        }
        #expect(
            RetentionPolicy.currentOnly.isExpired(deletedAt: Timestamp(rawValue: now.rawValue - 1), now: now))
        #expect(!RetentionPolicy.currentOnly.isExpired(deletedAt: now, now: now))
        #expect(
            !RetentionPolicy.currentOnly.isExpired(
                deletedAt: Timestamp(rawValue: now.rawValue + Self.day), now: now))
    }

    @Test func deletedDocumentsExpireAfterTheirPeriod() {
        let now = Timestamp(rawValue: Self.weekStart)
        let policy = RetentionPolicy.standard
        #expect(policy.deletedDocumentsExpireAfter == .seconds(30 * 86400))
        #expect(!policy.isExpired(deletedAt: Timestamp(rawValue: now.rawValue - 30 * Self.day), now: now))
        #expect(policy.isExpired(deletedAt: Timestamp(rawValue: now.rawValue - 30 * Self.day - 1), now: now))
        // A deletion stamped in the future counts as now.
        #expect(!policy.isExpired(deletedAt: Timestamp(rawValue: now.rawValue + 400 * Self.day), now: now))
        let never = try? RetentionPolicy(parsing: "deleted=forever")
        #expect(
            never?.isExpired(deletedAt: Timestamp(rawValue: Int64.min), now: Timestamp(rawValue: Int64.max))
                == false)
    }

    // MARK: Equal and future timestamps

    @Test func equalTimestampsKeepTheHighestIdOfTheBucket() {
        let now = Timestamp(rawValue: Self.weekStart)
        let old = now.rawValue - 3 * Self.day
        let versions = Self.history([(4, old), (9, old), (2, old), (7, old)])
        let daily = RetentionPolicy(keepLast: 1, keepAll: .seconds(3600), tiers: [.daily(for: nil)])
        // The newest (9) is kept twice over; nothing else.
        #expect(daily.versionsToKeep(versions, now: now) == Self.ids(9))
        let withNewer = versions + Self.history([(10, now.rawValue)])
        #expect(daily.versionsToKeep(withNewer, now: now) == Self.ids(9, 10))
        // Inside keepAll, all of them.
        let recent = Self.history([(4, now.rawValue - 1), (9, now.rawValue - 1), (2, now.rawValue - 1)])
        #expect(daily.versionsToKeep(recent, now: now) == Self.ids(2, 4, 9))
    }

    @Test func futureTimestampsCountAsNow() {
        let h = Self.weekStart  // an hour boundary
        let now = Timestamp(rawValue: h + 30 * Self.minute)
        let hourly = RetentionPolicy(keepLast: 1, keepAll: .zero, tiers: [.hourly(for: nil)])
        // 5, stamped two days ahead, counts as now: the newest of now's hour, which 2 is in.
        let ahead = Self.history([(2, h + 20 * Self.minute), (5, h + 2 * Self.day), (6, h - 3 * Self.hour)])
        #expect(hourly.versionsToKeep(ahead, now: now) == Self.ids(5, 6))
        // Kept by keepAll as if saved now.
        let window = RetentionPolicy(keepLast: 1, keepAll: .seconds(60), tiers: [])
        #expect(window.versionsToKeep(ahead, now: now) == Self.ids(5, 6))
        // Ids, not times, say which is newest: 6 is kept as the current version.
        let none = RetentionPolicy(keepLast: 1, keepAll: .zero, tiers: [])
        #expect(none.versionsToKeep(ahead, now: now) == Self.ids(6))
    }

    @Test func neverEmptyAndAlwaysTheNewestId() {
        var random = Generator(seed: 7)
        for _ in 0..<500 {
            let policy = Self.randomPolicy(&random)
            let now = Int64.random(in: 0...(Self.weekStart * 2), using: &random)
            let count = Int.random(in: 1...40, using: &random)
            let versions = Self.history(
                (0..<count).map { _ in
                    (
                        Int64.random(in: 1...100, using: &random),
                        [
                            Int64.min, Int64.max, now,
                            now + Int64.random(in: (-100 * Self.day)...Self.day, using: &random),
                        ]
                        .randomElement(using: &random) ?? now
                    )
                })
            let kept = policy.versionsToKeep(versions, now: Timestamp(rawValue: now))
            let newest = versions.map(\.id).max()
            #expect(newest.map(kept.contains) == true, "\(policy)")
            #expect(kept.isSubset(of: Set(versions.map(\.id))))
        }
    }

    // MARK: Values

    @Test func valuesAreHeldInRange() {
        var policy = RetentionPolicy(
            keepLast: -5, keepAll: .seconds(-1), tiers: [.init(interval: .seconds(-3), span: .seconds(-2))],
            deletedDocumentsExpireAfter: .nanoseconds(1) / 3)
        #expect(policy.keepLast == 1)
        #expect(policy.keepAll == .zero)
        #expect(policy.tiers == [.init(interval: .zero, span: .zero)])
        #expect(policy.deletedDocumentsExpireAfter == .zero)
        policy.keepLast = 0
        policy.keepAll = .seconds(1) + .nanoseconds(1) / 2
        policy.deletedDocumentsExpireAfter = .seconds(Int64.max)
        #expect(policy.keepLast == 1)
        #expect(policy.keepAll == .seconds(1))
        #expect(policy.deletedDocumentsExpireAfter == RetentionPolicy.forever)
        var tier = RetentionPolicy.Tier.daily(for: .seconds(400 * 365 * 86400))
        #expect(tier.span == nil)  // longer than forever: forever
        tier.span = .seconds(-1)
        #expect(tier.span == .zero)
        tier.interval = .seconds(-1)
        #expect(tier.interval == .zero)
    }

    // MARK: Text form

    @Test func descriptionOfTheNamedPolicies() throws {
        #expect(
            RetentionPolicy.standard.description
                == "last=10,all=1h,hourly=1d,daily=30d,weekly=forever,deleted=30d")
        #expect(RetentionPolicy.currentOnly.description == "last=1,all=0,deleted=0")
        #expect(RetentionPolicy().description == "last=50,all=30d,deleted=30d")
        #expect(try RetentionPolicy(parsing: "standard") == .standard)
        #expect(try RetentionPolicy(parsing: "current-only") == .currentOnly)
        #expect(
            try RetentionPolicy(parsing: "last=10,all=1h,hourly=1d,daily=30d,weekly=forever,deleted=30d")
                == .standard)
        #expect(
            try RetentionPolicy(
                parsing: " last=3 , all=1d12h, every=6h:for=2w,monthly=forever , deleted=forever ")
                == RetentionPolicy(
                    keepLast: 3, keepAll: .seconds(36 * 3600),
                    tiers: [
                        .init(interval: .seconds(6 * 3600), span: .seconds(14 * 86400)),
                        .monthly(for: nil),
                    ],
                    deletedDocumentsExpireAfter: RetentionPolicy.forever))
        // Omitted items take their defaults.
        #expect(
            try RetentionPolicy(parsing: "weekly=forever")
                == RetentionPolicy(keepLast: 1, keepAll: .zero, tiers: [.weekly(for: nil)]))
        #expect(try RetentionPolicy(parsing: "all=90s").keepAll == .seconds(90))
        #expect(try RetentionPolicy(parsing: "all=90s").description == "last=1,all=1m30s,deleted=30d")
        #expect(try RetentionPolicy(parsing: "all=1500ms").keepAll == .milliseconds(1500))
    }

    @Test(arguments: [
        ("", "", "no policy given"),
        ("  ", "  ", "no policy given"),
        ("last=0", "last=0", "at least 1"),
        ("last=ten", "last=ten", "whole number"),
        ("last=+5", "last=+5", "whole number"),
        ("last=5,all=1h,last=6", "last=6", "given twice"),
        ("all=1h,all=2h", "all=2h", "given twice"),
        ("all=1x", "all=1x", "unknown unit \"x\""),
        ("all=10", "all=10", "has no unit"),
        ("all=1.5h", "all=1.5h", "not a duration"),
        ("all=", "all=", "missing duration"),
        ("all=-1h", "all=-1h", "not a duration"),
        ("keep=1d", "keep=1d", "unknown key \"keep\""),
        ("Hourly=1d", "Hourly=1d", "unknown key"),
        ("hourly", "hourly", "key=value"),
        ("last=10,,all=1h", "", "empty item"),
        ("last=10,", "", "empty item"),
        ("hourly=1d,daily=sometimes", "daily=sometimes", "\"sometimes\" is not a duration"),
        ("daily=1d2", "daily=1d2", "\"2\" in \"1d2\" has no unit"),
        ("every=6h", "every=6h", "every=DURATION:for=DURATION"),
        ("every=6h:span=2d", "every=6h:span=2d", "every=DURATION:for=DURATION"),
        ("every=6h:for=", "every=6h:for=", "missing duration"),
        ("every=6q:for=1d", "every=6q:for=1d", "unknown unit \"q\""),
        ("deleted=300000d", "deleted=300000d", "too long"),
        ("deleted=99999999999999999999s", "deleted=99999999999999999999s", "too long"),
    ])
    func parseErrorsNameTheBadPart(text: String, part: String, reason: String) {
        let error = #expect(throws: RetentionPolicy.ParseError.self) { try RetentionPolicy(parsing: text) }
        #expect(error?.part == part)
        #expect(error?.reason.contains(reason) == true, "\(String(describing: error))")
        #expect(error?.description.contains("\"\(part)\"") == true)
    }

    static func randomDuration(_ random: inout Generator) -> Duration {
        let ns: Int64 =
            switch Int.random(in: 0..<9, using: &random) {
            case 0: 0
            case 1: 1
            case 2: Int64.max
            case 3: Int64.max - 1
            case 4: hour * Int64.random(in: 1...48, using: &random)
            case 5: day * Int64.random(in: 1...400, using: &random)
            case 6: week * Int64.random(in: 1...100, using: &random)
            case 7: Int64.random(in: 1...(1000 * second), using: &random) * 1_000_000
            default: Int64.random(in: 0...Int64.max, using: &random)
            }
        return .nanoseconds(ns)
    }

    static func randomPolicy(_ random: inout Generator) -> RetentionPolicy {
        let tiers = (0..<Int.random(in: 0...4, using: &random)).map { _ in
            RetentionPolicy.Tier(
                interval: Bool.random(using: &random)
                    ? [.seconds(3600), .seconds(86400), .seconds(604_800), .seconds(2_592_000)]
                        .randomElement(using: &random) ?? .zero
                    : randomDuration(&random),
                span: Int.random(in: 0..<4, using: &random) == 0 ? nil : randomDuration(&random))
        }
        return RetentionPolicy(
            keepLast: [1, 2, 10, 50, Int.random(in: 1...Int.max, using: &random)].randomElement(
                using: &random) ?? 1,
            keepAll: randomDuration(&random), tiers: tiers,
            deletedDocumentsExpireAfter: randomDuration(&random))
    }

    @Test func descriptionRoundTrips() throws {
        var random = Generator(seed: 8)
        var policies: [RetentionPolicy] = [
            .standard, .currentOnly, RetentionPolicy(),
            RetentionPolicy(keepLast: 3, keepFor: .milliseconds(1500)),
            RetentionPolicy(keepLast: 3, keepAll: .seconds(90), tiers: [.init(interval: .zero, span: .zero)]),
        ]
        for _ in 0..<1000 { policies.append(Self.randomPolicy(&random)) }
        for policy in policies {
            let text = policy.description
            let parsed = try RetentionPolicy(parsing: text)
            #expect(parsed == policy, "\(text) read back as \(parsed)")
            #expect(parsed.description == text)
            let json = try JSONEncoder().encode(policy)
            #expect(try JSONDecoder().decode(RetentionPolicy.self, from: json) == policy)
        }
    }

    @Test func codableIsReadableText() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let json = String(decoding: try encoder.encode(RetentionPolicy.standard), as: UTF8.self)
        #expect(
            json
                == #"{"deletedDocumentsExpireAfter":"30d","keepAll":"1h","keepLast":10,"tiers":[{"interval":"1h","span":"1d"},{"interval":"1d","span":"30d"},{"interval":"1w","span":"forever"}]}"#
        )
        let partial = try JSONDecoder().decode(RetentionPolicy.self, from: Data(#"{"keepAll":"2h"}"#.utf8))
        #expect(partial == RetentionPolicy(keepLast: 1, keepAll: .seconds(7200), tiers: []))
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(RetentionPolicy.self, from: Data(#"{"keepAll":"2 hours"}"#.utf8))
        }
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(RetentionPolicy.self, from: Data(#"{"tiers":[{"span":"1d"}]}"#.utf8))
        }
    }
}
