/// Which versions of a document garbage collection keeps, and when a deleted document's history
/// goes.
///
/// A main-line version is kept when any of these holds:
/// - it is among the newest `keepLast` versions (by id);
/// - its age is at most `keepAll` (a zero `keepAll` keeps none by age);
/// - its age falls in a tier, and it is the newest version (by id) of its bucket at that tier's
///   interval or at the interval of a later tier.
///
/// A version's age is `now` minus its creation time; a creation time after `now` (a clock step)
/// counts as `now`. Ids, not times, decide which version is newest, since ids grow with every save.
/// Buckets are `interval`-long spans of time counted from 1970-01-01 00:00 UTC, so the version
/// kept for a bucket is the same on every run while the bucket stays in its tier.
///
/// Durations are held in whole nanoseconds, the timestamps' resolution, from zero to
/// ``forever`` (`Int64.max` nanoseconds, about 292 years); setting one rounds it into that range.
public struct RetentionPolicy: Sendable, Equatable, Codable, CustomStringConvertible {
    /// The newest this many versions are always kept; at least 1 (the current version).
    public var keepLast: Int {
        didSet { keepLast = max(1, keepLast) }
    }
    /// Every version at most this old is kept; zero keeps none by age.
    public var keepAll: Duration {
        didSet { keepAll = Self.normalized(keepAll) }
    }
    /// Thinned history beyond `keepAll`, youngest first: the first tier starts at age `keepAll`,
    /// each later one where the previous one ends, and each holds the ages after its start up to
    /// and including its end. Tiers after one that lasts forever never apply.
    public var tiers: [Tier]
    /// A deleted document's history is removed once it has been deleted for longer than this.
    public var deletedDocumentsExpireAfter: Duration {
        didSet { deletedDocumentsExpireAfter = Self.normalized(deletedDocumentsExpireAfter) }
    }

    /// One version per `interval`-long bucket, for ages from the tier's start to `span` beyond.
    public struct Tier: Sendable, Equatable, Codable, CustomStringConvertible {
        /// The bucket length; zero keeps every version in the tier.
        public var interval: Duration {
            didSet { interval = RetentionPolicy.normalized(interval) }
        }
        /// How long the tier lasts; nil means forever.
        public var span: Duration? {
            didSet { span = RetentionPolicy.normalizedSpan(span) }
        }

        public init(interval: Duration, span: Duration?) {
            self.interval = RetentionPolicy.normalized(interval)
            self.span = RetentionPolicy.normalizedSpan(span)
        }

        /// Hour-long buckets.
        public static func hourly(for span: Duration?) -> Tier {
            Tier(interval: .seconds(RetentionPolicy.hour), span: span)
        }
        /// Day-long buckets (UTC days).
        public static func daily(for span: Duration?) -> Tier {
            Tier(interval: .seconds(RetentionPolicy.day), span: span)
        }
        /// Week-long buckets. Weeks count from 1970-01-01, a Thursday, so they run Thursday to
        /// Wednesday (UTC).
        public static func weekly(for span: Duration?) -> Tier {
            Tier(interval: .seconds(RetentionPolicy.week), span: span)
        }
        /// 30-day buckets (not calendar months).
        public static func monthly(for span: Duration?) -> Tier {
            Tier(interval: .seconds(RetentionPolicy.month), span: span)
        }

        /// `hourly=1d`, or `every=6h:for=2d` for an interval without a name.
        public var description: String {
            let span = RetentionPolicy.format(span.map(RetentionPolicy.nanoseconds) ?? .max)
            let interval = RetentionPolicy.nanoseconds(interval)
            if let name = RetentionPolicy.tierNames.first(where: { $0.interval == interval })?.name {
                return "\(name)=\(span)"
            }
            return "every=\(RetentionPolicy.format(interval)):for=\(span)"
        }

        private enum CodingKeys: String, CodingKey { case interval, span }

        /// Durations as text (`"1h"`, `"forever"`), exact and readable in a settings file.
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            let interval = try RetentionPolicy.decodeDuration(container, .interval, default: nil)
            let span = try RetentionPolicy.decodeDuration(container, .span, default: .max)
            self.init(interval: .nanoseconds(interval), span: .nanoseconds(span))
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(
                RetentionPolicy.format(RetentionPolicy.nanoseconds(interval)), forKey: .interval)
            try container.encode(
                RetentionPolicy.format(span.map(RetentionPolicy.nanoseconds) ?? .max), forKey: .span)
        }
    }

    /// Today's rule: a version goes only when it is beyond the newest `keepLast` and older than
    /// `keepFor`; a deleted document goes once deleted for longer than `keepFor`.
    ///
    /// One difference: a zero `keepFor` no longer keeps versions stamped at or after `now`.
    public init(keepLast: Int = 50, keepFor: Duration = .seconds(30 * 24 * 3600)) {
        self.init(keepLast: keepLast, keepAll: keepFor, tiers: [], deletedDocumentsExpireAfter: keepFor)
    }

    public init(
        keepLast: Int, keepAll: Duration, tiers: [Tier],
        deletedDocumentsExpireAfter: Duration = .seconds(30 * 24 * 3600)
    ) {
        self.keepLast = max(1, keepLast)
        self.keepAll = Self.normalized(keepAll)
        self.tiers = tiers
        self.deletedDocumentsExpireAfter = Self.normalized(deletedDocumentsExpireAfter)
    }

    /// `keepAll`, under its old name.
    @available(
        *, deprecated, renamed: "keepAll", message: "with tiers, versions older than keepAll may be kept too"
    )
    public var keepFor: Duration { keepAll }

    /// Every version of the last hour, then hourly for a day, daily for 30 days and weekly after
    /// that, and always the newest 10; deleted documents go after 30 days.
    public static let standard = RetentionPolicy(
        keepLast: 10, keepAll: .seconds(hour),
        tiers: [.hourly(for: .seconds(day)), .daily(for: .seconds(30 * day)), .weekly(for: nil)],
        deletedDocumentsExpireAfter: .seconds(30 * day))

    /// Only the current version; deleted documents go at the first collection after deletion.
    public static let currentOnly = RetentionPolicy(
        keepLast: 1, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .zero)

    /// The longest duration a policy holds, written `forever`.
    public static let forever = Duration.nanoseconds(Int64.max)

    // MARK: Deciding

    /// The versions to keep of one document's main line, given in any order. Never empty for a
    /// non-empty input: the newest id is always kept.
    public func versionsToKeep(_ versions: [(id: VersionID, created: Timestamp)], now: Timestamp) -> Set<
        VersionID
    > {
        var keep = Set(Set(versions.map(\.id)).sorted(by: >).prefix(max(1, keepLast)))
        let keepAll = Self.nanoseconds(keepAll)

        // The tiers that can apply, with the age each ends at (Int64.max: never).
        var reachable: [(interval: Int64, end: Int64)] = []
        var end = keepAll
        for tier in tiers {
            let span = tier.span.map(Self.nanoseconds) ?? .max
            end = Self.saturatingAdd(end, span)
            reachable.append((Self.nanoseconds(tier.interval), end))
            if end == .max { break }
        }

        // The newest id of each bucket, per tier, over all versions: a bucket's version is then
        // the same whatever else is dropped, which keeps the result stable from run to run.
        var newest = [[Int64: VersionID]](repeating: [:], count: reachable.count)
        for (t, tier) in reachable.enumerated() where tier.interval > 0 {
            for version in versions {
                let bucket = Self.bucket(min(version.created.rawValue, now.rawValue), tier.interval)
                if let id = newest[t][bucket], id >= version.id { continue }
                newest[t][bucket] = version.id
            }
        }

        for version in versions {
            let time = min(version.created.rawValue, now.rawValue)
            let age = Self.saturatingSubtract(now.rawValue, time)
            if keepAll > 0, age <= keepAll {
                keep.insert(version.id)
                continue
            }
            guard let first = reachable.firstIndex(where: { age <= $0.end }) else { continue }
            // Later tiers count too: a coarse bucket's version must survive the finer tiers it
            // passes through (with nested intervals, such as hour/day/week, this adds nothing).
            for t in first..<reachable.count {
                let interval = reachable[t].interval
                if t > first, reachable[t].end == reachable[t - 1].end { continue }  // lasts no time
                if interval == 0 || newest[t][Self.bucket(time, interval)] == version.id {
                    keep.insert(version.id)
                    break
                }
            }
        }
        return keep
    }

    /// Whether a document deleted at `deletedAt` has been deleted for longer than
    /// `deletedDocumentsExpireAfter`. A deletion time after `now` counts as `now`.
    public func isExpired(deletedAt: Timestamp, now: Timestamp) -> Bool {
        let age = Self.saturatingSubtract(now.rawValue, min(deletedAt.rawValue, now.rawValue))
        return age > Self.nanoseconds(deletedDocumentsExpireAfter)
    }

    // MARK: Text form

    /// The text form, which `init(parsing:)` reads back to an equal policy, e.g.
    /// `last=10,all=1h,hourly=1d,daily=30d,weekly=forever,deleted=30d`.
    public var description: String {
        (["last=\(keepLast)", "all=\(Self.format(Self.nanoseconds(keepAll)))"]
            + tiers.map(\.description)
            + ["deleted=\(Self.format(Self.nanoseconds(deletedDocumentsExpireAfter)))"])
            .joined(separator: ",")
    }

    /// Reads the text form: `standard`, `current-only`, or comma-separated items, each at most
    /// once except tiers:
    /// - `last=N`: `keepLast`, at least 1 (default 1);
    /// - `all=D`: `keepAll` (default 0);
    /// - `deleted=D`: `deletedDocumentsExpireAfter` (default 30d);
    /// - `hourly=D`, `daily=D`, `weekly=D`, `monthly=D` (30-day buckets) or `every=D:for=D`: a
    ///   tier of that interval lasting D; tiers apply in the order written.
    ///
    /// A duration D is `0`, `forever`, or numbers with units `w`, `d`, `h`, `m`, `s`, `ms`, `us`,
    /// `ns`, one or several (`90s`, `1d12h`).
    public init(parsing text: String) throws(ParseError) {
        let whole = Self.trimmed(Substring(text))
        switch whole {
        case "standard":
            self = .standard
            return
        case "current-only":
            self = .currentOnly
            return
        case "":
            throw ParseError(part: text, reason: "no policy given; e.g. \(Self.standard)")
        default: break
        }
        var keepLast: Int?
        var keepAll: Int64?
        var deleted: Int64?
        var tiers: [Tier] = []
        for rawItem in whole.split(separator: ",", omittingEmptySubsequences: false) {
            let item = Self.trimmed(rawItem)
            let part = String(item)
            guard !item.isEmpty else { throw ParseError(part: part, reason: "empty item (a stray comma?)") }
            guard let equals = item.firstIndex(of: "=") else {
                throw ParseError(part: part, reason: "expected key=value")
            }
            let key = item[..<equals]
            let value = item[item.index(after: equals)...]
            func once<T>(_ field: T?) throws(ParseError) {
                if field != nil { throw ParseError(part: part, reason: "\(key) is given twice") }
            }
            switch key {
            case "last":
                try once(keepLast)
                guard !value.isEmpty, value.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(value),
                    n >= 1
                else { throw ParseError(part: part, reason: "last must be a whole number, at least 1") }
                keepLast = n
            case "all":
                try once(keepAll)
                keepAll = try Self.parseDuration(value, in: part)
            case "deleted":
                try once(deleted)
                deleted = try Self.parseDuration(value, in: part)
            case "every":
                let parts = value.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
                guard parts.count == 2, parts[1].hasPrefix("for=") else {
                    throw ParseError(part: part, reason: "expected every=DURATION:for=DURATION")
                }
                let interval = try Self.parseDuration(parts[0], in: part)
                let span = try Self.parseDuration(parts[1].dropFirst(4), in: part)
                tiers.append(Tier(interval: .nanoseconds(interval), span: .nanoseconds(span)))
            default:
                guard let interval = Self.tierNames.first(where: { $0.name == key })?.interval else {
                    throw ParseError(
                        part: part,
                        reason:
                            "unknown key \"\(key)\"; use last, all, hourly, daily, weekly, monthly, every or deleted"
                    )
                }
                let span = try Self.parseDuration(value, in: part)
                tiers.append(Tier(interval: .nanoseconds(interval), span: .nanoseconds(span)))
            }
        }
        self.init(
            keepLast: keepLast ?? 1, keepAll: .nanoseconds(keepAll ?? 0), tiers: tiers,
            deletedDocumentsExpireAfter: .nanoseconds(deleted ?? 30 * Self.day * 1_000_000_000))
    }

    /// What is wrong with a policy's text form.
    public struct ParseError: Error, CustomStringConvertible, Equatable, Sendable {
        /// The item at fault, as written (the whole text when it is empty).
        public var part: String
        /// What is wrong with it.
        public var reason: String

        public init(part: String, reason: String) {
            self.part = part
            self.reason = reason
        }

        public var description: String { "bad retention policy \"\(part)\": \(reason)" }
    }

    // MARK: Coding

    private enum CodingKeys: String, CodingKey { case keepLast, keepAll, tiers, deletedDocumentsExpireAfter }

    /// Missing keys take `init(parsing:)`'s defaults; durations are text, as in the text form.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            keepLast: try container.decodeIfPresent(Int.self, forKey: .keepLast) ?? 1,
            keepAll: .nanoseconds(try Self.decodeDuration(container, .keepAll, default: 0)),
            tiers: try container.decodeIfPresent([Tier].self, forKey: .tiers) ?? [],
            deletedDocumentsExpireAfter: .nanoseconds(
                try Self.decodeDuration(
                    container, .deletedDocumentsExpireAfter, default: 30 * Self.day * 1_000_000_000)))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(keepLast, forKey: .keepLast)
        try container.encode(Self.format(Self.nanoseconds(keepAll)), forKey: .keepAll)
        try container.encode(tiers, forKey: .tiers)
        try container.encode(
            Self.format(Self.nanoseconds(deletedDocumentsExpireAfter)), forKey: .deletedDocumentsExpireAfter)
    }

    /// A duration written as text under `key`; `fallback` when absent (nil: required).
    private static func decodeDuration<Key: CodingKey>(
        _ container: KeyedDecodingContainer<Key>, _ key: Key, default fallback: Int64?
    ) throws -> Int64 {
        guard let text = try container.decodeIfPresent(String.self, forKey: key) else {
            guard let fallback else {
                throw DecodingError.keyNotFound(
                    key,
                    .init(
                        codingPath: container.codingPath, debugDescription: "\(key.stringValue) is required"))
            }
            return fallback
        }
        do throws(ParseError) {
            return try parseDuration(Substring(text), in: text)
        } catch {
            throw DecodingError.dataCorruptedError(
                forKey: key, in: container, debugDescription: error.description)
        }
    }

    // MARK: Durations

    private static let hour: Int64 = 3600
    private static let day: Int64 = 24 * hour
    private static let week: Int64 = 7 * day
    private static let month: Int64 = 30 * day

    /// The tier names of the text form, by interval in nanoseconds.
    private static let tierNames: [(name: Substring, interval: Int64)] = [
        ("hourly", hour * 1_000_000_000), ("daily", day * 1_000_000_000),
        ("weekly", week * 1_000_000_000), ("monthly", month * 1_000_000_000),
    ]

    /// Units of the text form, largest first, so that formatting can take them greedily.
    private static let units: [(name: String, nanoseconds: Int64)] = [
        ("w", week * 1_000_000_000), ("d", day * 1_000_000_000), ("h", hour * 1_000_000_000),
        ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000), ("ns", 1),
    ]

    /// `duration` in whole nanoseconds, within 0...Int64.max.
    static func nanoseconds(_ duration: Duration) -> Int64 {
        guard duration > .zero else { return 0 }
        let (seconds, attoseconds) = duration.components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        return overflow ? .max : saturatingAdd(whole, attoseconds / 1_000_000_000)
    }

    private static func normalized(_ duration: Duration) -> Duration { .nanoseconds(nanoseconds(duration)) }

    /// A span of `forever` or more is held as nil, so that each span has one representation.
    private static func normalizedSpan(_ span: Duration?) -> Duration? {
        guard let span else { return nil }
        let ns = nanoseconds(span)
        return ns == .max ? nil : .nanoseconds(ns)
    }

    /// `0`, `forever`, whole weeks (`2w`), or the other units largest first (`30d`, `1d12h`).
    private static func format(_ ns: Int64) -> String {
        if ns == 0 { return "0" }
        if ns == .max { return "forever" }
        // Weeks only when exact: `30d` reads better than `4w2d`.
        if ns % units[0].nanoseconds == 0 { return "\(ns / units[0].nanoseconds)w" }
        var rest = ns
        var text = ""
        for unit in units.dropFirst() where rest >= unit.nanoseconds {
            text += "\(rest / unit.nanoseconds)\(unit.name)"
            rest %= unit.nanoseconds
        }
        return text
    }

    /// Reads a duration of the text form, in nanoseconds; `part` names the item in errors.
    private static func parseDuration(_ text: Substring, in part: String) throws(ParseError) -> Int64 {
        if text == "0" { return 0 }
        if text == "forever" { return .max }
        let unitList = "w, d, h, m, s, ms, us or ns"
        guard !text.isEmpty else {
            throw ParseError(
                part: part, reason: "missing duration; e.g. 90s, 15m, 1h, 30d, 2w, 1d12h or forever")
        }
        var total: Int64 = 0
        var rest = text
        while !rest.isEmpty {
            let digits = rest.prefix(while: { $0.isASCII && $0.isNumber })
            rest = rest.dropFirst(digits.count)
            let unitName = rest.prefix(while: { $0.isASCII && $0.isLetter })
            rest = rest.dropFirst(unitName.count)
            guard !digits.isEmpty, !unitName.isEmpty || rest.isEmpty else {
                throw ParseError(
                    part: part,
                    reason: "\"\(text)\" is not a duration; e.g. 90s, 15m, 1h, 30d, 2w, 1d12h or forever")
            }
            // A bare number could mean seconds or days, so it is refused.
            guard !unitName.isEmpty else {
                throw ParseError(part: part, reason: "\"\(digits)\" in \"\(text)\" has no unit (\(unitList))")
            }
            guard let unit = units.first(where: { $0.name == unitName }) else {
                throw ParseError(
                    part: part, reason: "unknown unit \"\(unitName)\" in \"\(text)\"; use \(unitList)")
            }
            guard let count = Int64(digits) else { throw tooLong(text, part) }
            let (amount, overflow) = count.multipliedReportingOverflow(by: unit.nanoseconds)
            let (sum, overflow2) = total.addingReportingOverflow(amount)
            guard !overflow, !overflow2 else { throw tooLong(text, part) }
            total = sum
        }
        return total
    }

    private static func tooLong(_ text: Substring, _ part: String) -> ParseError {
        ParseError(part: part, reason: "\"\(text)\" is too long (at most about 292 years); write forever")
    }

    private static func trimmed(_ text: Substring) -> Substring {
        let start = text.drop(while: \.isWhitespace)
        return start.dropLast(start.reversed().prefix(while: \.isWhitespace).count)
    }

    // MARK: Arithmetic

    /// The bucket holding `time`: floor(time / interval), also for times before 1970.
    private static func bucket(_ time: Int64, _ interval: Int64) -> Int64 {
        let quotient = time / interval
        return time % interval < 0 ? quotient - 1 : quotient
    }

    private static func saturatingAdd(_ a: Int64, _ b: Int64) -> Int64 {
        let (sum, overflow) = a.addingReportingOverflow(b)
        return overflow ? (b > 0 ? .max : .min) : sum
    }

    private static func saturatingSubtract(_ a: Int64, _ b: Int64) -> Int64 {
        let (difference, overflow) = a.subtractingReportingOverflow(b)
        return overflow ? (b < 0 ? .max : .min) : difference
    }
}
