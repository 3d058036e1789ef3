import Foundation

// Placeholder until the tiered policy lands: the old two-limit rule.
public struct RetentionPolicy: Sendable, Equatable, CustomStringConvertible {
    public var keepLast: Int
    public var keepFor: Duration
    public var deletedDocumentsExpireAfter: Duration
    public init(keepLast: Int = 50, keepFor: Duration = .seconds(30 * 24 * 3600)) {
        self.keepLast = max(1, keepLast)
        self.keepFor = keepFor
        deletedDocumentsExpireAfter = keepFor
    }
    public static let currentOnly = RetentionPolicy(keepLast: 1, keepFor: .zero)
    public static let standard = RetentionPolicy()
    public struct ParseError: Error {}
    public init(parsing text: String) throws {
        let parts = text.split(separator: ",")
        guard parts.count == 2, let last = Int(parts[0]), let seconds = Int64(parts[1]) else { throw ParseError() }
        self.init(keepLast: last, keepFor: .seconds(seconds))
    }
    public var description: String { "\(keepLast),\(keepFor.components.seconds)" }
    func nanoseconds(_ d: Duration) -> Int64 { d.components.seconds * 1_000_000_000 + d.components.attoseconds / 1_000_000_000 }
    public func versionsToKeep(_ versions: [(id: VersionID, created: Timestamp)], now: Timestamp) -> Set<VersionID> {
        let sorted = versions.sorted { $0.id > $1.id }
        let horizon = now.rawValue - nanoseconds(keepFor)
        var keep = Set(sorted.prefix(keepLast).map(\.id))
        for v in sorted.dropFirst(keepLast) where v.created.rawValue >= horizon { keep.insert(v.id) }
        return keep
    }
    public func isExpired(deletedAt: Timestamp, now: Timestamp) -> Bool {
        deletedAt.rawValue < now.rawValue - nanoseconds(deletedDocumentsExpireAfter)
    }
}
