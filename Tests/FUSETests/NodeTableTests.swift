import FUSE
import Synchronization
import Testing

@Suite struct NodeTableTests {
    @Test func countsLookupsAndForgets() {
        let forgotten = Mutex<[String]>([])
        let table = NodeTable<String>(root: "/") { key, _ in forgotten.withLock { $0.append(key) } }
        #expect(table.node(for: "/") == .root)
        let (a, generation) = table.acquire("a")
        #expect(a != .root)
        #expect(generation == Generation(0))
        #expect(table.acquire("a").node == a)
        #expect(table.lookupCount(of: a) == 2)
        table.forget(a, lookups: 1)
        #expect(table.key(for: a) == "a")
        #expect(forgotten.withLock { $0 }.isEmpty)
        table.forget([ForgetItem(node: a, lookups: 1)])
        #expect(table.key(for: a) == nil)
        #expect(table.node(for: "a") == nil)
        #expect(forgotten.withLock { $0 } == ["a"])
    }

    @Test func reusedNodeIdsGetAHigherGeneration() {
        let table = NodeTable<Int>(root: 0)
        let (first, g0) = table.acquire(1)
        table.forget(first, lookups: 1)
        let (second, g1) = table.acquire(2)
        #expect(second == first)
        #expect(g1 > g0)
        #expect(table.key(for: second) == 2)
    }

    @Test func rootIsPinnedAndOverForgetIsClamped() {
        let table = NodeTable<Int>(root: 0)
        table.forget(.root, lookups: 100)
        #expect(table.key(for: .root) == 0)
        let (node, _) = table.acquire(7)
        table.forget(node, lookups: 5)
        #expect(table.key(for: node) == nil)
        #expect(table.count == 1)
    }
}
