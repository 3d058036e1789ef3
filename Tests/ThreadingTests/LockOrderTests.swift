import Testing

@testable import Threading

/// The lock order's rules, and the debug builds' record of the locks each thread holds: what
/// catches a lock taken out of order anywhere in the suite.
@Suite struct LockOrderTests {
    @Test func locksInIncreasingRankAreInOrder() {
        #expect(
            LockOrder.violation(taking: .view, key: 0, holding: [(.documentSaving, 1), (.fileChanges, 0)])
                == nil)
        #expect(LockOrder.violation(taking: .leaf, key: 0, holding: [(.view, 0)]) == nil)
    }

    @Test func aLowerRankAfterAHigherOneIsAViolation() throws {
        let problem = try #require(
            LockOrder.violation(taking: .documentSaving, key: 3, holding: [(.view, 0)]))
        #expect(problem.contains("taking document saving (3) while holding view"))
        #expect(LockOrder.violation(taking: .view, key: 0, holding: [(.leaf, 0)]) != nil)
    }

    @Test func severalOfOneRankOnlyInKeyOrder() {
        #expect(LockOrder.violation(taking: .documentSaving, key: 5, holding: [(.documentSaving, 2)]) == nil)
        #expect(LockOrder.violation(taking: .documentSaving, key: 2, holding: [(.documentSaving, 5)]) != nil)
        #expect(LockOrder.violation(taking: .documentSaving, key: 2, holding: [(.documentSaving, 2)]) != nil)
        // A rank that does not allow several: never two at once, whatever their keys.
        #expect(LockOrder.violation(taking: .fileChanges, key: 9, holding: [(.fileChanges, 1)]) != nil)
    }

    #if DEBUG
        @Test func aThreadsHeldLocksAreRecordedAndReleased() {
            let saving = OrderedLock(.documentSaving, key: 7)
            let view = Locked(.view, 0)
            #expect(LockOrder.held.isEmpty)
            saving.withLock {
                view.withLock { _ in
                    #expect(LockOrder.held.map(\.0) == [.documentSaving, .view])
                }
                #expect(LockOrder.held.map(\.0) == [.documentSaving])
            }
            #expect(LockOrder.held.isEmpty)
        }

        @Test func anotherThreadsLocksAreNotThisOnes() {
            let view = OrderedLock(.view)
            view.lock()
            let seen = Monitor<[LockRank]?>(nil)
            startDetachedThread(name: "other") { seen.withLock { $0 = LockOrder.held.map(\.0) } }
            seen.wait(until: { $0 != nil })
            view.unlock()
            // The other thread held the monitor's lock (a leaf) while it looked: nothing else.
            #expect(seen.withLock { $0 } == [.leaf])
        }
    #endif

    @Test func aWakeSignalSentBeforeTheWaitIsKept() {
        let signal = WakeSignal()
        signal.signal()
        #expect(signal.wait(timeout: .milliseconds(10)))
        #expect(!signal.wait(timeout: .milliseconds(10)))
    }

    @Test func aWorkCountWaitsForEveryLeave() {
        let work = WorkCount()
        let finished = Monitor(0)
        for _ in 0..<4 {
            work.enter()
            startDetachedThread(name: "worker") {
                finished.withLock { $0 += 1 }
                work.leave()
            }
        }
        work.wait()
        #expect(finished.withLock { $0 } == 4)
        #expect(work.wait(timeout: .zero))
    }
}
