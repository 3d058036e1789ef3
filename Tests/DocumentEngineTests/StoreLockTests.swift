import DocumentEngine
import Foundation
import StoreTestSupport
import Testing
import VersionedStore

/// The store's lock tables, on every backend, through two store objects as two mounts would
/// open them: POSIX's range rules, flock beside POSIX locks, deadlocks, leases, and the news of a
/// release reaching the other object.
@Suite("StoreLocks")
struct StoreLockTests {
    let lease: Duration = .seconds(30)

    func lock(
        _ session: LockSessionID, owner: Int64, _ range: ClosedRange<Int64>, exclusive: Bool,
        kind: SharedLockKind = .posix, node: Int64 = 7
    ) -> SharedLock {
        SharedLock(
            node: StoreNodeID(rawValue: node), session: session, owner: owner, kind: kind,
            exclusive: exclusive,
            start: range.lowerBound, last: range.upperBound, pid: 42)
    }

    func stores(_ kind: StoreKind) throws -> (StoreFixture, any SharedLockStore, any SharedLockStore) {
        let fixture = try StoreFixture(kind)
        let one = try #require(fixture.store.sharedLocks)
        let two = kind == .memory ? one : try #require(try fixture.reopen().sharedLocks)
        return (fixture, one, two)
    }

    @Test("record locks split, merge and conflict by range, as POSIX says", arguments: StoreKind.everyBackend)
    func ranges(_ kind: StoreKind) throws {
        let (fixture, one, two) = try stores(kind)
        defer { withExtendedLifetime(fixture) {} }
        let a = try one.openLockSession(label: "a", lease: lease)
        let b = try two.openLockSession(label: "b", lease: lease)
        #expect(
            try one.acquireLock(lock(a, owner: 1, 0...9, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(
            try one.acquireLock(lock(a, owner: 1, 20...29, exclusive: false), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.acquireLock(lock(b, owner: 5, 10...19, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.acquireLock(lock(b, owner: 5, 20...29, exclusive: false), waiting: false, lease: lease)
                == .granted)
        guard
            case .blocked(let holder) = try two.acquireLock(
                lock(b, owner: 5, 5...14, exclusive: true), waiting: false, lease: lease)
        else {
            Issue.record("a write over another owner's write lock was granted")
            return
        }
        #expect(holder.session == a && holder.start == 0 && holder.last == 9)
        // An unlock in the middle splits the lock in two.
        try one.releaseLock(
            node: StoreNodeID(rawValue: 7), session: a, owner: 1, kind: .posix, start: 3, last: 6)
        #expect(
            try two.acquireLock(lock(b, owner: 6, 3...6, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(try two.conflictingLock(lock(b, owner: 6, 0...2, exclusive: false))?.last == 2)
        #expect(try two.conflictingLock(lock(b, owner: 6, 7...9, exclusive: false))?.start == 7)
        // The same owner's locks never conflict: a write over its own read converts it.
        #expect(
            try one.acquireLock(lock(a, owner: 2, 100...199, exclusive: false), waiting: false, lease: lease)
                == .granted)
        #expect(
            try one.acquireLock(lock(a, owner: 2, 150...249, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.conflictingLock(lock(b, owner: 5, 120...120, exclusive: false)) == nil,
            "the read part stays shared")
        #expect(try two.conflictingLock(lock(b, owner: 5, 160...160, exclusive: false))?.exclusive == true)
        // Released everywhere, the file is free but for the other owner's own.
        try one.releaseLocks(session: a, owner: nil, node: nil)
        try two.releaseLocks(session: b, owner: 6, node: nil)
        #expect(
            try two.acquireLock(
                lock(b, owner: 5, 0...Int64.max, exclusive: false), waiting: false, lease: lease) == .granted)
    }

    @Test(
        "flock and POSIX locks do not see each other; flock converts in place",
        arguments: StoreKind.everyBackend)
    func flockBesidePosix(_ kind: StoreKind) throws {
        let (fixture, one, two) = try stores(kind)
        defer { withExtendedLifetime(fixture) {} }
        let a = try one.openLockSession(label: "a", lease: lease)
        let b = try two.openLockSession(label: "b", lease: lease)
        let all = Int64(0)...Int64.max
        #expect(
            try one.acquireLock(
                lock(a, owner: 1, all, exclusive: true, kind: .flock), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.acquireLock(lock(b, owner: 2, all, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.acquireLock(
                lock(b, owner: 3, all, exclusive: false, kind: .flock), waiting: false, lease: lease)
                != .granted)
        #expect(
            try one.acquireLock(
                lock(a, owner: 1, all, exclusive: false, kind: .flock), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.acquireLock(
                lock(b, owner: 3, all, exclusive: false, kind: .flock), waiting: false, lease: lease)
                == .granted)
    }

    @Test(
        "two owners waiting for each other's locks across stores: the second is told EDEADLK",
        arguments: StoreKind.everyBackend)
    func deadlock(_ kind: StoreKind) throws {
        let (fixture, one, two) = try stores(kind)
        defer { withExtendedLifetime(fixture) {} }
        let a = try one.openLockSession(label: "a", lease: lease)
        let b = try two.openLockSession(label: "b", lease: lease)
        #expect(
            try one.acquireLock(lock(a, owner: 1, 0...0, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(
            try two.acquireLock(lock(b, owner: 2, 1...1, exclusive: true), waiting: false, lease: lease)
                == .granted)
        guard
            case .blocked = try one.acquireLock(
                lock(a, owner: 1, 1...1, exclusive: true), waiting: true, lease: lease)
        else {
            Issue.record("the first wait was not blocked")
            return
        }
        #expect(
            try two.acquireLock(lock(b, owner: 2, 0...0, exclusive: true), waiting: true, lease: lease)
                == .deadlock)
        // A third owner waiting on the same lock is no cycle.
        guard
            case .blocked = try two.acquireLock(
                lock(b, owner: 3, 0...0, exclusive: true), waiting: true, lease: lease)
        else {
            Issue.record("a plain wait was not blocked")
            return
        }
    }

    @Test(
        "a session whose lease ran out loses its locks to the next request, and is told",
        arguments: StoreKind.everyBackend)
    func leases(_ kind: StoreKind) throws {
        let (fixture, one, two) = try stores(kind)
        defer { withExtendedLifetime(fixture) {} }
        let short: Duration = .milliseconds(300)
        let a = try one.openLockSession(label: "a", lease: short)
        let b = try two.openLockSession(label: "b", lease: lease)
        #expect(
            try one.acquireLock(lock(a, owner: 1, 0...9, exclusive: true), waiting: false, lease: short)
                == .granted)
        #expect(
            try two.acquireLock(lock(b, owner: 2, 0...9, exclusive: true), waiting: false, lease: lease)
                != .granted)
        #expect(try one.renewLockSession(a, lease: short, timeout: .seconds(5)))
        usleep(500_000)
        #expect(
            try two.acquireLock(lock(b, owner: 2, 0...9, exclusive: true), waiting: false, lease: lease)
                == .granted)
        #expect(try one.renewLockSession(a, lease: short, timeout: .seconds(5)) == false)
        #expect(
            try one.acquireLock(lock(a, owner: 1, 20...29, exclusive: true), waiting: false, lease: short)
                == .sessionLost)
    }

    @Test(
        "a release reaches the other store object's waiters as news, without polling",
        arguments: StoreKind.everyBackend)
    func releaseNews(_ kind: StoreKind) throws {
        let (fixture, one, two) = try stores(kind)
        defer { withExtendedLifetime(fixture) {} }
        let a = try one.openLockSession(label: "a", lease: lease)
        #expect(
            try one.acquireLock(lock(a, owner: 1, 0...9, exclusive: true), waiting: false, lease: lease)
                == .granted)
        // Listening starts with the first look, and counts itself as news.
        var seen = two.lockGeneration
        seen = two.waitForLockRelease(after: seen, timeout: .milliseconds(500))
        seen = two.waitForLockRelease(after: seen, timeout: .milliseconds(200))
        let start = ContinuousClock.now
        try one.releaseLocks(session: a, owner: 1, node: StoreNodeID(rawValue: 7))
        let after = two.waitForLockRelease(after: seen, timeout: .seconds(5))
        let waited = ContinuousClock.now - start
        #expect(after > seen, "no news of the release")
        #expect(waited < .seconds(2), "the news took \(waited)")
    }
}
